//! CEL rules used on more than one type, so the message stays identical everywhere.

use kube::core::{Message, Rule};

/// Pool names in user-written maps are at most 25 characters (the name ends up in pod and
/// StatefulSet names).
pub(crate) fn pool_name_length() -> Rule {
    Rule::new("self.all(key, size(key) <= 25)").message("pool names must be <= 25 chars")
}

/// Pool names in user-written maps are DNS labels; the schema cannot bound map keys.
pub(crate) fn pool_name_pattern() -> Rule {
    Rule::new("self.all(key, key.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))").message(
        "pool names must consist of lowercase letters, digits and '-', and start and end with a letter or digit",
    )
}

/// Pools, once created, keep their PVCs and topology entries: they cannot be removed or renamed.
pub(crate) fn pools_append_only() -> Rule {
    Rule::new("oldSelf.all(k, k in self)")
        .message("Pools cannot be removed or renamed in this version (Append-Only)")
}

/// Pool names of resolved (operator-written) specs, as upstream bounds them.
pub(crate) fn resolved_pool_name_length() -> Rule {
    Rule::new("self.all(key, size(key) < 63)").message("pool names must be < 63 chars")
}

/// A spec is either inline or from a template, never both.
pub(crate) fn not_both(inline: &str, other: &str) -> Rule {
    Rule::new(format!("!(has(self.{inline}) && has(self.{other}))")).message(Message::Message(
        format!("cannot specify both '{inline}' and '{other}'"),
    ))
}

/// A cell is pinned by exactly one node label: `zone`, `zoneId` or `region`.
pub(crate) fn zone_or_region_exclusive() -> Rule {
    Rule::new(
        "(has(self.zone) ? 1 : 0) + (has(self.zoneId) ? 1 : 0) + (has(self.region) ? 1 : 0) <= 1",
    )
    .message("cannot specify more than one of 'zone', 'zoneId' and 'region'")
}

/// A cell must say where it runs.
pub(crate) fn zone_or_region_required() -> Rule {
    Rule::new("has(self.zone) || has(self.zoneId) || has(self.region)")
        .message("at least one of 'zone', 'zoneId' or 'region' must be specified")
}

/// Annotations on operator-managed Services must not collide with the operator's own keys.
pub(crate) fn no_reserved_annotations() -> Rule {
    Rule::new("!has(self.annotations) || self.annotations.all(k, !k.startsWith('multigres.com/'))")
        .message("annotations must not use multigres.com/ prefix (reserved for operator)")
}
