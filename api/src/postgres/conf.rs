//! The postgresql.conf syntax: quoting values so any text is written literally, and reading a
//! file back into settings (the rendered file and the content of a `postgresConfigRef`), so
//! the effective value of every setting is known.

use std::collections::BTreeMap;

/// A value as a quoted postgresql.conf string: single quotes doubled and backslashes doubled
/// (PostgreSQL reads backslash escapes inside quotes).
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Why a postgresql.conf line cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct SyntaxError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub problem: String,
}

/// Whether `name` is a parameter name PostgreSQL can read from a file: a letter or `_`, then
/// letters, digits, `_` or `$`; extension parameters are two such words joined by a `.`.
pub fn is_valid_name(name: &str) -> bool {
    let word = |w: &str| {
        let mut chars = w.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    match name.split_once('.') {
        Some((ext, param)) => word(ext) && word(param),
        None => word(name),
    }
}

/// The settings a postgresql.conf sets, by lower-cased name; a later line wins as in
/// PostgreSQL. `include` directives are kept as settings of that name, so validation sees and
/// refuses them.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, SyntaxError> {
    let mut settings = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let error = |problem: String| SyntaxError {
            line: index + 1,
            problem,
        };
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(|c: char| c.is_whitespace() || c == '=' || c == '#' || c == '\'')
            .unwrap_or(line.len());
        let name = &line[..name_end];
        if !is_valid_name(name) {
            return Err(error(format!("{name:?} is not a parameter name")));
        }
        let rest = line[name_end..].trim_start();
        let rest = rest.strip_prefix('=').unwrap_or(rest).trim_start();
        let (value, after) = if let Some(quoted) = rest.strip_prefix('\'') {
            unquote(quoted).ok_or_else(|| error(format!("unterminated quoted value of {name}")))?
        } else {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '#')
                .unwrap_or(rest.len());
            if end == 0 {
                return Err(error(format!("{name} has no value")));
            }
            (rest[..end].to_owned(), &rest[end..])
        };
        let after = after.trim_start();
        if !(after.is_empty() || after.starts_with('#')) {
            return Err(error(format!(
                "unexpected {after:?} after the value of {name}"
            )));
        }
        settings.insert(name.to_ascii_lowercase(), value);
    }
    Ok(settings)
}

/// Reads a quoted value whose opening quote is already consumed: the value and what follows
/// the closing quote, or `None` when the quote never closes.
fn unquote(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' if chars.peek().is_some_and(|(_, n)| *n == '\'') => {
                chars.next();
                value.push('\'');
            }
            '\'' => return Some((value, &text[i + 1..])),
            '\\' => {
                let (_, escaped) = chars.next()?;
                value.push(match escaped {
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    other => other,
                });
            }
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_quotes_and_backslashes_and_reads_back_unchanged() {
        assert_eq!(quote("it's"), "'it''s'");
        assert_eq!(quote(r"C:\dir"), r"'C:\\dir'");
        for value in ["it's", r"a\b", "%h %m [%p] %q%u@%d ", "", "''"] {
            let line = format!("x = {}", quote(value));
            assert_eq!(parse(&line).unwrap()["x"], value, "{line}");
        }
    }

    #[test]
    fn files_parse_with_comments_optional_equals_and_last_line_winning() {
        let text = "# comment\n\
                    \n\
                    shared_buffers = 128MB   # trailing\n\
                    work_mem '4MB'\n\
                    Work_Mem = 8MB\n\
                    auto_explain.log_min_duration=10s\n\
                    log_line_prefix = '%m # not a comment'\n";
        let settings = parse(text).unwrap();
        assert_eq!(settings.len(), 4);
        assert_eq!(settings["shared_buffers"], "128MB");
        assert_eq!(settings["work_mem"], "8MB");
        assert_eq!(settings["auto_explain.log_min_duration"], "10s");
        assert_eq!(settings["log_line_prefix"], "%m # not a comment");
    }

    #[test]
    fn malformed_lines_are_refused_with_their_number() {
        let e = parse("a = 1\nwork_mem =\n").unwrap_err();
        assert_eq!(e.to_string(), "line 2: work_mem has no value");
        let e = parse("x = 'open\n").unwrap_err();
        assert_eq!(e.to_string(), "line 1: unterminated quoted value of x");
        let e = parse("x = 1 2\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: unexpected \"2\" after the value of x"
        );
        let e = parse("9lives = on\n").unwrap_err();
        assert_eq!(e.to_string(), "line 1: \"9lives\" is not a parameter name");
    }

    #[test]
    fn names_are_words_or_extension_qualified_words() {
        for good in ["work_mem", "TimeZone", "_x$1", "pg_stat_statements.max"] {
            assert!(is_valid_name(good), "{good}");
        }
        for bad in ["", "1x", "a-b", "a.b.c", ".x", "x.", "a b"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }
}
