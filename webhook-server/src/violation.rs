//! What a rule finds: violations (the request is refused, every one reported at once, each naming
//! the field) and warnings (returned to the client, the request still goes through).

use std::fmt;

/// One reason to refuse a request: the offending field and what is allowed there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Field path in the object, e.g. `spec.cells[1].zoneId`; for values coming from a template,
    /// the template and its field.
    pub field: String,
    /// What is wrong and what is allowed instead.
    pub message: String,
}

impl Violation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Everything a set of rules found about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Reasons to refuse; empty means allowed.
    pub violations: Vec<Violation>,
    /// Risky but allowed settings, shown to the client.
    pub warnings: Vec<String>,
}

impl Findings {
    /// Records a violation of `field`.
    pub fn violation(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.violations.push(Violation::new(field, message));
    }

    /// Records a warning about `field`.
    pub fn warning(&mut self, field: impl fmt::Display, message: impl fmt::Display) {
        self.warnings.push(format!("{field}: {message}"));
    }

    /// Adds everything `other` found.
    pub fn extend(&mut self, other: Findings) {
        self.violations.extend(other.violations);
        self.warnings.extend(other.warnings);
    }

    /// Whether the request may go through.
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The denial message: every violation, in order, so one round trip shows them all.
    pub fn message(&self) -> String {
        match self.violations.as_slice() {
            [] => String::new(),
            [one] => one.to_string(),
            many => {
                let listed: Vec<String> = many.iter().map(Violation::to_string).collect();
                format!("{} problems: {}", many.len(), listed.join("; "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_lists_every_violation() {
        let mut findings = Findings::default();
        assert!(findings.allowed());
        assert_eq!(findings.message(), "");
        findings.violation("spec.a", "must be set");
        assert_eq!(findings.message(), "spec.a: must be set");
        findings.violation("spec.b[1]", "is too big");
        findings.warning("spec.c", "is risky");
        assert!(!findings.allowed());
        assert_eq!(
            findings.message(),
            "2 problems: spec.a: must be set; spec.b[1]: is too big"
        );
        assert_eq!(findings.warnings, ["spec.c: is risky"]);
    }
}
