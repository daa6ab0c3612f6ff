//! A steady SQL client through multigateway, and the check that every row it was told was
//! written is still there: what the real-node tests hold the data plane to while they disturb
//! it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use tokio::task::JoinHandle;

use crate::harness::eventually;
use crate::real::{Endpoint, Session};
use crate::sample::WAIT;

/// Prints a figure of a run (`[figure] <what>: <value>`), for `just data-plane-figures`.
pub fn figure(what: &str, value: impl std::fmt::Display) {
    println!("[figure] {what}: {value}");
}

/// A steady client: one statement every 50 ms through the gateway until stopped, reconnecting
/// after errors. Counts successes and failures; keeps the ids of acknowledged inserts.
pub struct Load {
    stop: Arc<AtomicBool>,
    task: JoinHandle<LoadReport>,
}

/// What a [`Load`] saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Statements that succeeded.
    pub ok: usize,
    /// Statements that failed.
    pub failed: usize,
    /// Ids whose INSERT was acknowledged.
    pub acknowledged: Vec<i64>,
    /// When each of them was acknowledged (wall clock, to compare with times in a status).
    pub acknowledged_at: Vec<Timestamp>,
    /// When each success happened, to find the first after an event.
    pub successes: Vec<Instant>,
    /// The first few errors, for the log.
    pub errors: Vec<String>,
}

impl LoadReport {
    /// Prints the failed statements (of all) and the longest gap during `what`.
    pub fn figures(&self, what: &str) {
        figure(
            &format!("failed statements during {what}"),
            format!("{} of {}", self.failed, self.ok + self.failed),
        );
        figure(
            &format!("longest gap between successful statements during {what} (s)"),
            format!("{:.1}", self.longest_gap().as_secs_f64()),
        );
    }

    /// The longest time between two successful statements: how long clients saw no service
    /// (failed statements are retried every 50 ms, so their count depends on that pace).
    fn longest_gap(&self) -> Duration {
        self.successes
            .windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .max()
            .unwrap_or_default()
    }
}

impl Load {
    /// Alternates `INSERT INTO ledger (id) VALUES (<n>)` (ids from `first_id`) and a read.
    pub fn start(gateway: Endpoint, first_id: i64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut session = Session::new(gateway);
            let mut report = LoadReport::default();
            let mut id = first_id;
            while !flag.load(Ordering::Relaxed) {
                let write = id % 2 == 0;
                let sql = if write {
                    format!("INSERT INTO ledger (id) VALUES ({id})")
                } else {
                    "SELECT count(*) FROM ledger".to_owned()
                };
                match session.run(&sql).await {
                    Ok(_) => {
                        report.ok += 1;
                        report.successes.push(Instant::now());
                        if write {
                            report.acknowledged.push(id);
                            report.acknowledged_at.push(Timestamp::now());
                        }
                    }
                    Err(e) => {
                        report.failed += 1;
                        if report.errors.len() < 5 {
                            report.errors.push(e);
                        }
                    }
                }
                id += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            report
        });
        Load { stop, task }
    }

    /// Stops the client after its current statement; what it saw.
    pub async fn finish(self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Creates the table the [`Load`] writes to, with 100 rows (ids -1 to -100) written and read
/// back through `gateway`; their ids. Set-up, not what a test measures: idempotent statements,
/// retried while a fresh gateway connection fails (a loaded machine can miss the 5 s connect).
pub async fn create_ledger(gateway: &Endpoint) -> Vec<i64> {
    eventually("the ledger created with 100 rows", WAIT, || async {
        gateway
            .query("CREATE TABLE IF NOT EXISTS ledger (id bigint PRIMARY KEY, at timestamptz DEFAULT now())")
            .await?;
        gateway
            .query("INSERT INTO ledger (id) SELECT -g FROM generate_series(1, 100) g ON CONFLICT DO NOTHING")
            .await?;
        match gateway.query("SELECT count(*) FROM ledger").await? {
            count if count == [[Some("100".to_owned())]] => Ok(()),
            count => Err(format!("count {count:?}")),
        }
    })
    .await;
    (1..=100).map(|g| -g).collect()
}

/// The ids in the ledger of the PostgreSQL at `endpoint` (the gateway or one pod).
pub async fn ledger(endpoint: &Endpoint) -> Result<BTreeSet<i64>, String> {
    let rows = endpoint.query("SELECT id FROM ledger").await?;
    Ok(rows
        .iter()
        .filter_map(|r| r[0].as_deref()?.parse().ok())
        .collect())
}

/// Every acknowledged id is in the table (read through the gateway).
pub async fn assert_kept(gateway: &Endpoint, acknowledged: &[i64]) -> usize {
    let stored = eventually("the ledger reads back", WAIT, || ledger(gateway)).await;
    let lost: Vec<&i64> = acknowledged
        .iter()
        .filter(|id| !stored.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged rows lost: {lost:?}",
        lost.len()
    );
    stored.len()
}
