// Command netpol enforces NetworkPolicies on the real-node test tier with the SIG Network
// reference implementation, kube-network-policies: its controller decides every new connection
// that reaches it through an NFQUEUE, from the NetworkPolicies, Namespaces and Pods it watches.
//
// Two things differ from upstream's per-node binary:
//
//   - Upstream steers packets to its queue with nftables' `queue` expression. The test kernel is
//     built without CONFIG_NFT_QUEUE (`nft add rule inet t c queue num 100` fails with "Could not
//     process rule: No such file or directory"), but it has the xtables NFQUEUE target. So this
//     wrapper installs the steering rules itself with iptables, the same rules upstream writes:
//     established and related connections, the root user's own sockets (the harness and the
//     kubelets' probes) and DNS pass; every other packet from or to a pod address is queued.
//     The controller still tries its own nftables table on every change and logs that it cannot.
//   - Every node of the tier shares one network namespace, so one controller decides for all of
//     them: its verdict depends on the pods' labels and namespaces, not on the node.
//
// NRI is left on, though containerd 1.6 serves no NRI socket (the controller logs that it
// cannot connect and takes pod addresses from the API server alone): with NRI disabled,
// v0.8.0 dereferences its absent NRI plugin for every address that is no pod's and crashes
// (controller.go:190). The queue bypasses while no controller listens (as during start-up), so a
// cluster that starts before the controller keeps working and a dead controller shows as
// connections that are not refused.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

// chain is this wrapper's own chain in the mangle table; POSTROUTING jumps to it first.
const chain = "E2E-NETWORK-POLICIES"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	podCIDR := flag.String("pod-cidr", "", "address range of every pod of the cluster")
	queueID := flag.Int("nfqueue-id", 100, "NFQUEUE the controller reads")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *podCIDR, *queueID); err != nil {
		fmt.Fprintln(os.Stderr, "netpol:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, podCIDR string, queueID int) error {
	if kubeconfig == "" || podCIDR == "" {
		return fmt.Errorf("--kubeconfig and --pod-cidr are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	if err := steer(podCIDR, queueID); err != nil {
		return err
	}
	defer unsteer()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := networkpolicy.NewController(
		client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{
			QueueID:     queueID,
			NFTableName: "kube-network-policies",
		},
	)
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	return controller.Run(ctx)
}

// steer queues every new connection from or to a pod for the controller's verdict.
func steer(podCIDR string, queueID int) error {
	unsteer()
	queue := []string{"-j", "NFQUEUE", "--queue-num", strconv.Itoa(queueID), "--queue-bypass"}
	rules := [][]string{
		{"-N", chain},
		{"-A", chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"},
		{"-A", chain, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"},
		{"-A", chain, "-p", "udp", "--dport", "53", "-j", "RETURN"},
		append([]string{"-A", chain, "-s", podCIDR}, queue...),
		append([]string{"-A", chain, "-d", podCIDR}, queue...),
		{"-I", "POSTROUTING", "1", "-j", chain},
	}
	for _, rule := range rules {
		if err := iptables(rule...); err != nil {
			return err
		}
	}
	return nil
}

// unsteer removes the rules steer installed, if any.
func unsteer() {
	_ = iptables("-D", "POSTROUTING", "-j", chain)
	_ = iptables("-F", chain)
	_ = iptables("-X", chain)
}

func iptables(args ...string) error {
	full := append([]string{"-w", "-t", "mangle"}, args...)
	out, err := exec.Command("iptables", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %v: %v: %s", full, err, out)
	}
	return nil
}
