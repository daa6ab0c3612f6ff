//! `docs/architecture.md` against the code: every row of its "Cross-handler contracts" table
//! names a file and a constant (`defined in`), and that constant must hold exactly the row's
//! value; every `multigres.com/` constant of `api/src/labels.rs` must have a row.

mod common;

use std::collections::BTreeSet;

const DOC: &str = "docs/architecture.md";
const TABLE_HEADING: &str = "## Cross-handler contracts";
const HEADER: [&str; 6] = [
    "contract",
    "value",
    "kind",
    "written by",
    "read by",
    "defined in",
];
const LABELS: &str = "api/src/labels.rs";

/// One row of the contracts table.
#[derive(Debug)]
struct Row {
    /// 1-based line in the document.
    line: usize,
    contract: String,
    value: String,
    file: String,
    constant: String,
}

impl Row {
    fn name(&self) -> String {
        format!("{DOC}:{} ({}, `{}`)", self.line, self.contract, self.value)
    }
}

/// The spans between backticks of a table cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn cells(line: &str) -> Vec<&str> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(str::trim).collect()
}

/// The rows of the contracts table, or the reasons they cannot be read.
fn parse_table(doc: &str) -> Result<Vec<Row>, Vec<String>> {
    let mut lines = doc.lines().enumerate();
    if !lines.any(|(_, l)| l.trim() == TABLE_HEADING) {
        return Err(vec![format!("{DOC} has no heading {TABLE_HEADING:?}")]);
    }
    let Some((header_at, header)) = lines.find(|(_, l)| l.trim_start().starts_with('|')) else {
        return Err(vec![format!("{DOC}: no table under {TABLE_HEADING:?}")]);
    };
    if cells(header) != HEADER {
        return Err(vec![format!(
            "{DOC}:{}: the contracts table header must be `| {} |`, found `{}`",
            header_at + 1,
            HEADER.join(" | "),
            header.trim()
        )]);
    }
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for (at, line) in lines.skip(1) {
        if !line.trim_start().starts_with('|') {
            break;
        }
        let line_no = at + 1;
        let row = cells(line);
        if row.len() != HEADER.len() {
            problems.push(format!(
                "{DOC}:{line_no}: {} cells, expected {}: {}",
                row.len(),
                HEADER.len(),
                line.trim()
            ));
            continue;
        }
        let value = code_spans(row[1]);
        let defined_in = code_spans(row[5]);
        match (value.as_slice(), defined_in.as_slice()) {
            ([value], [file, constant]) => rows.push(Row {
                line: line_no,
                contract: row[0].to_owned(),
                value: (*value).to_owned(),
                file: (*file).to_owned(),
                constant: (*constant).to_owned(),
            }),
            _ => problems.push(format!(
                "{DOC}:{line_no} ({}): `value` must be one `code span` and `defined in` must be \
                 `path/to/file.rs` `CONST_NAME`, found {:?} and {:?}",
                row[0], row[1], row[5]
            )),
        }
    }
    if problems.is_empty() {
        Ok(rows)
    } else {
        Err(problems)
    }
}

/// The string literals assigned to `const <name>` in `source` (any visibility, any type
/// annotation, over several lines if rustfmt wrapped it); `Err` holds a declaration whose value
/// is not a plain literal.
fn const_values(source: &str, name: &str) -> Vec<Result<String, String>> {
    let needle = format!("const {name}:");
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = source[from..].find(&needle) {
        let start = from + offset;
        from = start + needle.len();
        let preceded_by_word = source[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if preceded_by_word {
            continue;
        }
        let Some(end) = source[from..].find(';') else {
            continue;
        };
        let declaration = &source[start..from + end];
        let Some((_, value)) = declaration.split_once('=') else {
            continue;
        };
        let value = value.trim();
        found.push(
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .filter(|v| !v.contains('"') && !v.contains('\\'))
                .map(str::to_owned)
                .ok_or_else(|| declaration.split_whitespace().collect::<Vec<_>>().join(" ")),
        );
    }
    found
}

fn contracts() -> Vec<Row> {
    let path = common::repo_root().join(DOC);
    let doc =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let rows = parse_table(&doc).unwrap_or_else(|problems| panic!("{}", problems.join("\n")));
    assert!(
        rows.len() >= 20,
        "{DOC}: the contracts table has only {} rows",
        rows.len()
    );
    rows
}

#[test]
fn every_contract_row_matches_its_constant() {
    let root = common::repo_root();
    let mut problems = Vec::new();
    for row in contracts() {
        let path = root.join(&row.file);
        let Ok(source) = std::fs::read_to_string(&path) else {
            problems.push(format!(
                "{}: file `{}` does not exist (moved?)",
                row.name(),
                row.file
            ));
            continue;
        };
        let values = const_values(&source, &row.constant);
        if values.is_empty() {
            problems.push(format!(
                "{}: `{}` has no `const {}` (renamed?)",
                row.name(),
                row.file,
                row.constant
            ));
        }
        for value in values {
            match value {
                Ok(v) if v == row.value => {}
                Ok(v) => problems.push(format!(
                    "{}: `{}` has `const {}` = {v:?}, the doc says {:?}",
                    row.name(),
                    row.file,
                    row.constant,
                    row.value
                )),
                Err(declaration) => problems.push(format!(
                    "{}: `{}` declares `{declaration}`, not a string literal; name the \
                     constant that holds the literal",
                    row.name(),
                    row.file
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_multigres_label_constant_has_a_row() {
    let source = std::fs::read_to_string(common::repo_root().join(LABELS))
        .unwrap_or_else(|e| panic!("read {LABELS}: {e}"));
    let listed: BTreeSet<String> = contracts()
        .into_iter()
        .filter(|row| row.file == LABELS)
        .map(|row| row.constant)
        .collect();
    let ours: Vec<&str> = source
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, value) = rest.split_once(':')?;
            let literal = value.split_once('=')?.1.trim();
            literal
                .starts_with("\"multigres.com/")
                .then_some(name.trim())
        })
        .collect();
    assert!(
        ours.len() >= 7,
        "found only {ours:?} in {LABELS}: the scan no longer matches its declarations"
    );
    let missing: Vec<&&str> = ours.iter().filter(|n| !listed.contains(**n)).collect();
    assert!(
        missing.is_empty(),
        "{LABELS} defines {missing:?} (multigres.com/...) without a row in the contracts table \
         of {DOC}: add one, with who writes and who reads it"
    );
}

#[test]
fn const_values_reads_declarations_as_rustfmt_writes_them() {
    let source = r#"
pub const ROLE: &str = "multigres.com/role";
pub(crate) const LONG_NAME: &'static str =
    "multigres_operator_something_long";
const ALIAS: &str = other::ROLE;
pub const NOT_ROLE: &str = "x";
"#;
    assert_eq!(
        const_values(source, "ROLE"),
        [Ok("multigres.com/role".into())]
    );
    assert_eq!(
        const_values(source, "LONG_NAME"),
        [Ok("multigres_operator_something_long".into())]
    );
    assert_eq!(
        const_values(source, "ALIAS"),
        [Err("const ALIAS: &str = other::ROLE".into())]
    );
    assert!(const_values(source, "MISSING").is_empty());
}
