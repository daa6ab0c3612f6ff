//! Checks of the network fields of a cluster's spec that the schema cannot make: address
//! ranges that parse as CIDRs, and NetworkPolicy sources Kubernetes would accept. The webhook
//! rejects a cluster that fails them; the resource-handler refuses to apply one that got past
//! it (e.g. with the webhook down), so a bad range is reported against the field that holds it
//! instead of as a failed write.

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;

use crate::v1alpha1::{ExternalServiceConfig, MultigresClusterSpec};

/// One field that cannot be realised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidNetworkField {
    /// Path of the field, e.g. `spec.networkPolicy.gatewaySources[0].ipBlock.cidr`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub problem: String,
}

fn invalid(field: String, problem: String) -> InvalidNetworkField {
    InvalidNetworkField { field, problem }
}

/// `text` as a CIDR, or what is wrong with it.
fn cidr(field: String, text: &str) -> Result<IpNet, InvalidNetworkField> {
    text.parse::<IpNet>().map_err(|_| {
        invalid(
            field,
            format!(
                "{text:?} is not a CIDR; use an IPv4 (203.0.113.0/24) or IPv6 (2001:db8::/32) \
                 address with a prefix length"
            ),
        )
    })
}

/// Every problem of the cluster's load-balancer source ranges and NetworkPolicy sources, in
/// field order.
pub fn invalid_fields(spec: &MultigresClusterSpec) -> Vec<InvalidNetworkField> {
    let mut out = Vec::new();
    let exposures = [
        ("spec.externalGateway", spec.external_gateway.as_ref()),
        ("spec.externalAdminWeb", spec.external_admin_web.as_ref()),
    ];
    for (path, config) in exposures {
        out.extend(source_ranges(path, config));
    }
    if let Some(policy) = &spec.network_policy {
        let lists = [
            ("spec.networkPolicy.gatewaySources", &policy.gateway_sources),
            (
                "spec.networkPolicy.adminWebSources",
                &policy.admin_web_sources,
            ),
            ("spec.networkPolicy.metricsSources", &policy.metrics_sources),
        ];
        for (path, peers) in lists {
            for (i, peer) in peers.iter().enumerate() {
                out.extend(peer_problems(&format!("{path}[{i}]"), peer));
            }
        }
    }
    out
}

fn source_ranges(
    path: &str,
    config: Option<&ExternalServiceConfig>,
) -> impl Iterator<Item = InvalidNetworkField> {
    config
        .into_iter()
        .flat_map(|c| c.load_balancer_source_ranges.iter().enumerate())
        .filter_map(move |(i, range)| {
            let field = format!("{path}.loadBalancerSourceRanges[{i}]");
            cidr(field, range.as_str()).err()
        })
}

/// What Kubernetes would refuse in a NetworkPolicy peer: none of the three kinds of source,
/// an `ipBlock` beside selectors, a range that does not parse, or an exception outside it.
fn peer_problems(path: &str, peer: &NetworkPolicyPeer) -> Vec<InvalidNetworkField> {
    let selectors = peer.namespace_selector.is_some() || peer.pod_selector.is_some();
    let Some(block) = &peer.ip_block else {
        if selectors {
            return Vec::new();
        }
        return vec![invalid(
            path.to_owned(),
            "names no source; set namespaceSelector and/or podSelector, or ipBlock".to_owned(),
        )];
    };
    if selectors {
        return vec![invalid(
            path.to_owned(),
            "sets ipBlock beside a selector; a source is either an ipBlock or selectors, so \
             list them as two sources"
                .to_owned(),
        )];
    }
    let range = match cidr(format!("{path}.ipBlock.cidr"), &block.cidr) {
        Ok(range) => range,
        Err(e) => return vec![e],
    };
    let mut out = Vec::new();
    for (i, except) in block.except.iter().flatten().enumerate() {
        let field = format!("{path}.ipBlock.except[{i}]");
        match cidr(field.clone(), except) {
            Ok(except) if range.contains(&except) => {}
            Ok(_) => out.push(invalid(
                field,
                format!("{except:?} is not inside the ipBlock's cidr {range}"),
            )),
            Err(e) => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> MultigresClusterSpec {
        let base = "postgresPasswordSecretRef: {name: pw, key: password}\n";
        serde_yaml::from_str(&format!("{base}{yaml}")).unwrap()
    }

    fn fields(spec: &MultigresClusterSpec) -> Vec<String> {
        invalid_fields(spec).into_iter().map(|f| f.field).collect()
    }

    #[test]
    fn valid_ranges_and_sources_pass() {
        let spec = spec(
            "externalGateway: {enabled: true, loadBalancerSourceRanges: [203.0.113.0/24, '2001:db8::/32']}\n\
             networkPolicy:\n  gatewaySources:\n\
             \x20   - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}\n\
             \x20   - namespaceSelector: {matchLabels: {team: apps}}\n\
             \x20     podSelector: {matchLabels: {app: api}}\n",
        );
        assert_eq!(fields(&spec), Vec::<String>::new());
    }

    #[test]
    fn each_bad_field_is_named() {
        let spec = spec(
            "externalAdminWeb: {enabled: false, loadBalancerSourceRanges: [10.0.0.0/8, 10.0.0.1]}\n\
             networkPolicy:\n  gatewaySources:\n\
             \x20   - {}\n\
             \x20   - ipBlock: {cidr: 10.0.0.0/33}\n\
             \x20   - ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16, x]}\n\
             \x20 adminWebSources:\n\
             \x20   - ipBlock: {cidr: 10.0.0.0/8}\n\
             \x20     podSelector: {}\n",
        );
        assert_eq!(
            fields(&spec),
            [
                "spec.externalAdminWeb.loadBalancerSourceRanges[1]",
                "spec.networkPolicy.gatewaySources[0]",
                "spec.networkPolicy.gatewaySources[1].ipBlock.cidr",
                "spec.networkPolicy.gatewaySources[2].ipBlock.except[0]",
                "spec.networkPolicy.gatewaySources[2].ipBlock.except[1]",
                "spec.networkPolicy.adminWebSources[0]",
            ]
        );
        let message = invalid_fields(&spec)[0].to_string();
        assert!(message.contains("\"10.0.0.1\" is not a CIDR"), "{message}");
    }
}
