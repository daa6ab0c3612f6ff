//! The backup request annotations of a MultigresCluster (`multigres.com/backup-request` and
//! `multigres.com/backup-request-type`, see [`multigres_api::backup_request`]): an id the
//! data-handler cannot answer in status, or a type it does not know, is refused with the
//! annotation's name and what it may be.
//!
//! Checked on every create and update that sets or changes them, metadata-only updates
//! included (`kubectl annotate` changes nothing else), and only then: a value stored before
//! this rule, left as it is, never blocks another change.

use std::collections::BTreeMap;

use multigres_api::backup_request::{
    ID_RULE, REQUEST, REQUEST_TYPE, TYPE_RULE, parse_kind, valid_id,
};

use crate::violation::Findings;

/// Checks the request annotations of `new` that differ from `old` (`None` on create).
pub fn check(
    findings: &mut Findings,
    new: &BTreeMap<String, String>,
    old: Option<&BTreeMap<String, String>>,
) {
    let changed = |key: &str| old.is_none_or(|old| old.get(key) != new.get(key));
    if let Some(id) = new.get(REQUEST).filter(|_| changed(REQUEST))
        && !valid_id(id)
    {
        findings.violation(
            format!("metadata.annotations[{REQUEST}]"),
            format!("{id:?} is not a backup request id: use {ID_RULE}"),
        );
    }
    if let Some(kind) = new.get(REQUEST_TYPE).filter(|_| changed(REQUEST_TYPE))
        && parse_kind(kind).is_none()
    {
        findings.violation(
            format!("metadata.annotations[{REQUEST_TYPE}]"),
            format!("{kind:?} is not a backup type: use {TYPE_RULE}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn checked(new: &[(&str, &str)], old: Option<&[(&str, &str)]>) -> Vec<(String, String)> {
        let mut findings = Findings::default();
        let old = old.map(annotations);
        check(&mut findings, &annotations(new), old.as_ref());
        findings
            .violations
            .iter()
            .map(|v| (v.field.clone(), v.message.clone()))
            .collect()
    }

    #[test]
    fn a_request_id_and_type_are_checked_when_set() {
        assert!(
            checked(
                &[(REQUEST, "20261204T221500Z"), (REQUEST_TYPE, "diff")],
                None
            )
            .is_empty()
        );
        assert!(checked(&[], None).is_empty());
        let bad = checked(
            &[(REQUEST, "before the migration"), (REQUEST_TYPE, "weekly")],
            None,
        );
        assert_eq!(
            bad,
            [
                (
                    "metadata.annotations[multigres.com/backup-request]".to_owned(),
                    format!("\"before the migration\" is not a backup request id: use {ID_RULE}")
                ),
                (
                    "metadata.annotations[multigres.com/backup-request-type]".to_owned(),
                    "\"weekly\" is not a backup type: use full, diff or incr".to_owned()
                ),
            ]
        );
        let long = "x".repeat(64);
        assert_eq!(checked(&[(REQUEST, &long)], None).len(), 1);
    }

    #[test]
    fn a_value_stored_before_is_not_held_against_another_change() {
        let stored: &[(&str, &str)] = &[(REQUEST, "not valid")];
        assert!(checked(stored, Some(stored)).is_empty());
        assert_eq!(
            checked(&[(REQUEST, "still not valid")], Some(stored)).len(),
            1
        );
    }
}
