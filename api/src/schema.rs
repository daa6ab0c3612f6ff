//! Schema helpers shared by the API types: constrained string newtypes and the embedding of
//! Kubernetes core types with trimmed descriptions.
//!
//! Kubernetes core types carry very long descriptions (Quantity's alone is about 2 KB and is
//! repeated at every use). Embedded verbatim, they would push the MultigresCluster CRD towards the
//! 1 MiB object limit and bury our own field docs in `kubectl explain`. Every embedded core type
//! therefore goes through [`embedded`] or [`embedded_list`], which keep only the first sentence of
//! each description inside the embedded type.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::Value;

/// Longest description kept inside an embedded core type, in characters.
const MAX_EMBEDDED_DESCRIPTION: usize = 160;

/// Schema of a Kubernetes core type `T` with every description inside it cut to its first
/// sentence. Use with `#[schemars(schema_with = "crate::schema::embedded::<T>")]`.
pub(crate) fn embedded<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut value = T::json_schema(generator).to_value();
    trim_descriptions(&mut value);
    Schema::try_from(value).expect("a schema stays a schema when descriptions are trimmed")
}

/// Schema of a list of Kubernetes core type `T`, trimmed like [`embedded`].
pub(crate) fn embedded_list<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let items = embedded::<T>(generator);
    json_schema!({ "type": "array", "items": items })
}

/// [`embedded_list`] of at most `MAX` items.
pub(crate) fn embedded_list_of_at_most<T: JsonSchema, const MAX: usize>(
    generator: &mut SchemaGenerator,
) -> Schema {
    let items = embedded::<T>(generator);
    json_schema!({ "type": "array", "items": items, "maxItems": MAX })
}

/// Cuts every `description` under `value` to its first sentence (at most
/// [`MAX_EMBEDDED_DESCRIPTION`] characters).
fn trim_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    Value::String(text) if key == "description" => *text = first_sentence(text),
                    _ => trim_descriptions(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(trim_descriptions),
        _ => {}
    }
}

/// The first sentence of `text`: up to the first ". " that does not end an abbreviation such as
/// "e.g.", or the first line break; capped in length.
fn first_sentence(text: &str) -> String {
    const ABBREVIATIONS: [&str; 3] = ["e.g", "i.e", "etc"];
    let line = text.split('\n').next().unwrap_or_default();
    let end = line
        .match_indices(". ")
        .map(|(i, _)| i)
        .find(|&i| !ABBREVIATIONS.iter().any(|a| line[..i].ends_with(a)))
        .map_or(line.len(), |i| i + 1);
    let sentence = line[..end].trim();
    if sentence.chars().count() <= MAX_EMBEDDED_DESCRIPTION {
        return sentence.to_owned();
    }
    let cut: String = sentence
        .chars()
        .take(MAX_EMBEDDED_DESCRIPTION - 3)
        .collect();
    format!("{}...", cut.trim_end())
}

/// Defines a string newtype whose schema carries length bounds and an optional pattern, so every
/// use of the name (fields, list items) is validated the same way by the API server.
macro_rules! constrained_string {
    (
        $(#[$meta:meta])*
        $name:ident {
            min: $min:expr, max: $max:expr $(, pattern: $pattern:expr)?
            $(, rule: $rule:expr, message: $message:expr)? $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash,
            ::serde::Serialize, ::serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string without checking it; the API server enforces the schema.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Unwraps the string.
            pub fn into_inner(self) -> String {
                self.0
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                #[allow(unused_mut)]
                let mut schema = ::schemars::json_schema!({
                    "type": "string",
                    "minLength": $min,
                    "maxLength": $max,
                });
                $(schema.insert("pattern".into(), $pattern.into());)?
                $(schema.insert(
                    "x-kubernetes-validations".into(),
                    ::serde_json::json!([{"rule": $rule, "message": $message}]),
                );)?
                schema
            }
        }

        impl ::std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl ::std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

pub(crate) use constrained_string;

/// Removes the type-level description of an enum's schema, so the describing field's doc wins.
///
/// kube's `OptionalEnum` transform hoists an `Option<enum>`'s inner schema over the field's own,
/// which would replace every field description with the enum type's. Use as
/// `#[schemars(transform = crate::schema::field_described)]` on enums.
pub(crate) fn field_described(schema: &mut Schema) {
    schema.remove("description");
}

/// `serde(skip_serializing_if)` helper for flags that upstream omits when false.
pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sentence_stops_at_period_or_newline() {
        assert_eq!(first_sentence("One thing. Two things."), "One thing.");
        assert_eq!(first_sentence("Line one\nline two"), "Line one");
        assert_eq!(first_sentence("No terminator"), "No terminator");
        assert_eq!(
            first_sentence("Version 1.2 is used. Rest"),
            "Version 1.2 is used."
        );
    }

    #[test]
    fn first_sentence_caps_long_text() {
        let long = "word ".repeat(100);
        let cut = first_sentence(&long);
        assert!(cut.chars().count() <= MAX_EMBEDDED_DESCRIPTION);
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn embedded_trims_nested_descriptions() {
        let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
        let schema =
            embedded::<k8s_openapi::apimachinery::pkg::api::resource::Quantity>(&mut generator);
        let description = schema.get("description").and_then(Value::as_str).unwrap();
        assert_eq!(
            description,
            "Quantity is a fixed-point representation of a number."
        );
    }
}
