use kube::ResourceExt;

use super::*;

const OPERATOR_NS: &str = "multigres-system";

/// The fixture cluster (`prod` in `db`) with `extra` spec fields.
fn cluster(extra: &str) -> MultigresCluster {
    let mut c: MultigresCluster =
        serde_yaml::from_str(include_str!("../../fixtures/cluster-external-topo.yaml")).unwrap();
    let extra: MultigresCluster = serde_yaml::from_str(&format!(
        "{{apiVersion: multigres.com/v1alpha1, kind: MultigresCluster, metadata: {{name: x}}, \
         spec: {{postgresPasswordSecretRef: {{name: pg, key: password}}, {extra}}}}}"
    ))
    .unwrap();
    c.spec.network_policy = extra.spec.network_policy;
    c.spec.external_admin_web = extra.spec.external_admin_web;
    c
}

fn built(c: &MultigresCluster) -> Vec<NetworkPolicy> {
    let owner = Owner::with_cluster(c, "prod".into()).unwrap();
    build(
        &owner,
        c,
        Trusted {
            operator_namespace: OPERATOR_NS,
        },
    )
}

/// A source in short form: `own pods`, `ns <name>`, `every namespace`, `cidr <range>` or
/// `selector`.
fn peer(p: &NetworkPolicyPeer) -> String {
    let own = Some(cluster_pods("prod"));
    match (&p.namespace_selector, &p.pod_selector, &p.ip_block) {
        (None, selector, None) if *selector == own => "own pods".to_owned(),
        (Some(ns), None, None) if *ns == LabelSelector::default() => "every namespace".to_owned(),
        (Some(ns), None, None) => match ns
            .match_labels
            .as_ref()
            .and_then(|l| l.get(NAMESPACE_NAME_LABEL))
        {
            Some(name) => format!("ns {name}"),
            None => "selector".to_owned(),
        },
        (None, None, Some(block)) => format!("cidr {}", block.cidr),
        _ => "selector".to_owned(),
    }
}

/// Each rule of `policy` as (ports, sources); `None`: every source.
fn rules(policy: &NetworkPolicy) -> Vec<(Vec<i32>, Option<Vec<String>>)> {
    let spec = policy.spec.as_ref().unwrap();
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    assert_eq!(spec.egress, None, "egress is never restricted");
    spec.ingress
        .iter()
        .flatten()
        .map(|rule| {
            let ports = rule
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    assert_eq!(p.protocol.as_deref(), Some("TCP"));
                    match p.port {
                        Some(IntOrString::Int(port)) => port,
                        ref other => panic!("port {other:?}"),
                    }
                })
                .collect();
            let from = rule.from.as_ref().map(|f| f.iter().map(peer).collect());
            (ports, from)
        })
        .collect()
}

fn named<'a>(policies: &'a [NetworkPolicy], name: &str) -> &'a NetworkPolicy {
    policies
        .iter()
        .find(|p| p.name_any() == name)
        .unwrap_or_else(|| panic!("no policy {name}"))
}

fn internal() -> Option<Vec<String>> {
    Some(vec!["own pods".into(), format!("ns {OPERATOR_NS}")])
}

#[test]
fn by_default_internal_ports_admit_the_cluster_and_the_operator_and_the_gateway_everyone() {
    let policies = built(&cluster(""));
    let names: Vec<_> = policies.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        [
            "prod-deny-ingress",
            "prod-topo-ingress",
            "prod-pool-ingress",
            "prod-multiorch-ingress",
            "prod-multiadmin-ingress",
            "prod-multiadmin-web-ingress",
            "prod-multigateway-ingress",
        ]
    );
    let table: Vec<_> = policies.iter().map(|p| (p.name_any(), rules(p))).collect();
    let expected = [
        ("prod-deny-ingress", vec![]),
        (
            "prod-topo-ingress",
            vec![
                (vec![2379, 2380], internal()),
                (vec![2381], Some(vec!["every namespace".into()])),
            ],
        ),
        (
            "prod-pool-ingress",
            vec![
                (vec![15200, 15270, 15400, 5432, 8432], internal()),
                (vec![9187], Some(vec!["every namespace".into()])),
            ],
        ),
        (
            "prod-multiorch-ingress",
            vec![(vec![15300, 15370], internal())],
        ),
        (
            "prod-multiadmin-ingress",
            vec![(vec![18000, 18070], internal())],
        ),
        (
            "prod-multiadmin-web-ingress",
            vec![(vec![18100], internal())],
        ),
        (
            "prod-multigateway-ingress",
            vec![(vec![5432, 5433], None), (vec![15100, 15170], internal())],
        ),
    ];
    let expected: Vec<_> = expected
        .into_iter()
        .map(|(name, rules)| (name.to_owned(), rules))
        .collect();
    assert_eq!(table, expected);
}

#[test]
fn pgctld_grpc_is_open_to_no_one() {
    for policy in built(&cluster("")) {
        for (ports, _) in rules(&policy) {
            assert!(
                !ports.contains(&crate::contract::PGCTLD_GRPC),
                "{}",
                policy.name_any()
            );
        }
    }
}

#[test]
fn each_policy_selects_its_pods_and_is_owned_by_the_cluster() {
    let policies = built(&cluster(""));
    let selector = |name: &str| {
        named(&policies, name)
            .spec
            .as_ref()
            .unwrap()
            .pod_selector
            .clone()
            .unwrap()
    };
    assert_eq!(selector("prod-deny-ingress"), cluster_pods("prod"));
    assert_eq!(
        selector("prod-pool-ingress"),
        pods_of("prod", Component::Pool)
    );
    let topo = selector("prod-topo-ingress");
    assert_eq!(topo.match_labels, cluster_pods("prod").match_labels);
    assert_eq!(
        topo.match_expressions.unwrap()[0].values.as_deref(),
        Some(&["global-topo".to_owned(), "local-topo".to_owned()][..])
    );
    for policy in &policies {
        assert_eq!(policy.namespace().as_deref(), Some("db"));
        let owner = &policy.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("MultigresCluster", "prod", Some(true))
        );
        assert_eq!(
            policy.labels()["app.kubernetes.io/managed-by"],
            "multigres-operator"
        );
        assert_eq!(
            policy.labels()["app.kubernetes.io/component"],
            "network-policy"
        );
    }
}

#[test]
fn listed_sources_replace_everyone_on_the_gateway_and_join_the_web_ui() {
    let c = cluster(
        "networkPolicy: {gatewaySources: [{ipBlock: {cidr: 10.0.0.0/8}}, \
         {namespaceSelector: {matchLabels: {team: apps}}}], \
         adminWebSources: [{ipBlock: {cidr: 192.168.0.0/16}}]}",
    );
    let policies = built(&c);
    assert_eq!(
        rules(named(&policies, "prod-multigateway-ingress"))[0],
        (
            vec![5432, 5433],
            Some(vec!["cidr 10.0.0.0/8".into(), "selector".into()])
        )
    );
    let mut web = internal().unwrap();
    web.push("cidr 192.168.0.0/16".into());
    assert_eq!(
        rules(named(&policies, "prod-multiadmin-web-ingress")),
        [(vec![18100], Some(web))]
    );
}

#[test]
fn listed_metrics_sources_alone_reach_the_metrics_ports() {
    let c = cluster(
        "networkPolicy: {metricsSources: [{namespaceSelector: \
         {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]}",
    );
    let policies = built(&c);
    let only_monitoring = Some(vec!["ns monitoring".to_owned()]);
    assert_eq!(
        rules(named(&policies, "prod-pool-ingress"))[1],
        (vec![9187], only_monitoring.clone())
    );
    assert_eq!(
        rules(named(&policies, "prod-topo-ingress"))[1],
        (vec![2381], only_monitoring)
    );
}

#[test]
fn an_exposed_web_ui_admits_everyone_unless_sources_are_listed() {
    let exposed = built(&cluster("externalAdminWeb: {enabled: true}"));
    assert_eq!(
        rules(named(&exposed, "prod-multiadmin-web-ingress")),
        [(vec![18100], None)]
    );
    let listed = built(&cluster(
        "externalAdminWeb: {enabled: true}, \
         networkPolicy: {adminWebSources: [{ipBlock: {cidr: 192.168.0.0/16}}]}",
    ));
    let from = rules(named(&listed, "prod-multiadmin-web-ingress"))[0]
        .1
        .clone();
    assert_eq!(from.map(|f| f.len()), Some(3));
}

#[test]
fn opting_out_builds_none_and_unset_means_enabled() {
    assert!(built(&cluster("networkPolicy: {enabled: false}")).is_empty());
    assert_eq!(built(&cluster("networkPolicy: {enabled: true}")).len(), 7);
    assert_eq!(built(&cluster("networkPolicy: {}")).len(), 7);
}
