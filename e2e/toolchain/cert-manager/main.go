// Command cert-manager runs cert-manager's controller for the real-node test tier: the
// certificate controllers and the CA and self-signed issuers, from the cert-manager module.
//
// Upstream's binary lives in a module of its own (cmd/controller) that the Go module proxy does
// not serve, so this wrapper starts the same registered controllers from the main module.
// ACME, Vault and Venafi issuers, the ingress and Gateway shims and leader election are left
// out: the tests issue from a CA ClusterIssuer and run one instance.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	controller "github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	resources := flag.String("cluster-resource-namespace", "cert-manager",
		"namespace of the Secrets that ClusterIssuers reference")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *resources); err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, resources string) error {
	if kubeconfig == "" {
		return fmt.Errorf("--kubeconfig is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:    kubeconfig,
		IssuerOptions: controller.IssuerOptions{ClusterResourceNamespace: resources},
		CertificateOptions: controller.CertificateOptions{
			// cert-manager's defaults.
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return err
	}
	known := controller.Known()
	names := make([]string, 0, len(known))
	for name := range known {
		names = append(names, name)
	}
	sort.Strings(names)
	errs := make(chan error, len(names))
	for _, name := range names {
		loop, err := known[name](factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		klog.InfoS("starting controller", "controller", name)
		go func() { errs <- loop.Run(5, ctx) }()
	}
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		return err
	}
}
