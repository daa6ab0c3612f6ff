//! A real browser for the tests that look at a web page: Debian's Chromium, headless, loads a
//! page, runs its scripts (the multiadmin UI renders its tables from API calls made in the
//! browser) and hands back the document as it then stands.

use std::time::Duration;

use tokio::process::Command;

/// Chromium as Debian installs it (`e2e/toolchain/packages.sh`); `MULTIGRES_CHROMIUM` overrides.
const CHROMIUM: &str = "/usr/bin/chromium";

/// How long the page's scripts may run (virtual time: Chromium also waits for the network
/// requests they make).
const SCRIPT_BUDGET: Duration = Duration::from_secs(15);

/// The whole run, start to exit, is bounded by this.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// Loads `url` in headless Chromium and returns the rendered document (`--dump-dom`). Without
/// background networking, sync or component updates: the sandbox reaches nothing else.
pub async fn rendered_document(url: &str) -> Result<String, String> {
    let chromium = std::env::var("MULTIGRES_CHROMIUM").unwrap_or_else(|_| CHROMIUM.to_owned());
    let profile = tempfile::tempdir().map_err(|e| format!("a profile directory: {e}"))?;
    let run = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-proxy-server",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!(
            "--virtual-time-budget={}",
            SCRIPT_BUDGET.as_millis()
        ))
        .arg("--dump-dom")
        .arg(url)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUN_LIMIT, run)
        .await
        .map_err(|_| format!("{chromium} {url}: no exit within {RUN_LIMIT:?}"))?
        .map_err(|e| format!("{chromium}: {e} (install Debian's chromium package)"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!("{chromium} {url}: {}: {tail:?}", output.status));
    }
    String::from_utf8(output.stdout).map_err(|e| format!("{url}: the document is not UTF-8: {e}"))
}

/// The data rows of the tables in `document` (rows of `<td>` cells, header rows left out),
/// each cell's text with its markup removed.
pub fn table_rows(document: &str) -> Vec<Vec<String>> {
    document
        .split("<tr")
        .skip(1)
        .map(|row| {
            let row = row.split("</tr>").next().unwrap_or_default();
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let inner = cell.split_once('>').map_or("", |(_, rest)| rest);
                    text(inner.split("</td>").next().unwrap_or_default())
                })
                .collect::<Vec<_>>()
        })
        .filter(|cells| !cells.is_empty())
        .collect()
}

/// The text of an HTML fragment: tags dropped, the five predefined entities decoded, runs of
/// white space made one space.
fn text(fragment: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in fragment.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    let decoded = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&amp;", "&");
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_each_cells_text_and_leave_out_headers() {
        let document = r#"<table><thead><tr><th>Cell</th><th>Type</th></tr></thead>
            <tbody><tr class="x"><td class="pl-6">zone-a</td><td><span class="b">PRIMARY</span></td></tr>
            <tr><td>zone-b</td><td><span>REPLICA</span> &amp; more</td></tr></tbody></table>"#;
        assert_eq!(
            table_rows(document),
            vec![
                vec!["zone-a".to_owned(), "PRIMARY".to_owned()],
                vec!["zone-b".to_owned(), "REPLICA & more".to_owned()],
            ]
        );
    }

    #[test]
    fn a_document_without_tables_has_no_rows() {
        assert!(table_rows("<html><body><p>Loading multipoolers...</p></body></html>").is_empty());
    }
}
