//! What a run measured: the plan, the figures with their baselines, and how they are printed.

use std::time::Duration;

/// How long and how wide to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Duration of each throughput measurement.
    pub seconds: Duration,
    /// Concurrent clients (each on its own connection).
    pub clients: Vec<usize>,
    /// Ledger sizes for the growth measurement.
    pub growth: Vec<u64>,
    /// Claims measured at each size.
    pub growth_ops: usize,
    /// Replays (and plain reads) measured.
    pub replay_ops: usize,
    /// Request fingerprints computed, each way.
    pub fingerprint_ops: u32,
}

impl Plan {
    /// Half of each figure's time in whole seconds (at least one), as pgbench's `-T` takes
    /// them: a variant measured in two halves, in turning order, runs as long as pgbench does.
    pub(crate) fn half(&self) -> Duration {
        Duration::from_secs(self.seconds.as_secs().div_ceil(2).max(1))
    }

    /// The short run: 3 s per figure instead of 15.
    pub fn quick() -> Self {
        Self {
            seconds: Duration::from_secs(3),
            clients: vec![1, 8, 32],
            growth: vec![1_000, 10_000, 100_000],
            growth_ops: 300,
            replay_ops: 500,
            fingerprint_ops: 20_000,
        }
    }

    /// The full run.
    pub fn full() -> Self {
        Self {
            seconds: Duration::from_secs(15),
            clients: vec![1, 8, 32],
            growth: vec![1_000, 100_000, 1_000_000],
            growth_ops: 2_000,
            replay_ops: 3_000,
            fingerprint_ops: 200_000,
        }
    }

    /// A harness check with tiny counts (no timing conclusions).
    pub fn smoke() -> Self {
        Self {
            seconds: Duration::from_millis(200),
            clients: vec![2],
            growth: vec![100, 200],
            growth_ops: 10,
            replay_ops: 10,
            fingerprint_ops: 10,
        }
    }
}

/// One measured figure, with its baseline when it has one.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What was measured.
    pub name: String,
    /// Its unit.
    pub unit: &'static str,
    /// The value.
    pub value: f64,
    /// The figure it is compared with.
    pub baseline: Option<String>,
    /// value / baseline.
    pub ratio: Option<f64>,
}

pub(crate) fn figure(name: String, unit: &'static str, value: f64) -> Figure {
    Figure {
        name,
        unit,
        value,
        baseline: None,
        ratio: None,
    }
}

pub(crate) fn compared(name: String, unit: &'static str, value: f64, baseline: &Figure) -> Figure {
    Figure {
        name,
        unit,
        value,
        ratio: (baseline.value > 0.0).then(|| value / baseline.value),
        baseline: Some(baseline.name.clone()),
    }
}

/// The figures as a printable table.
pub fn table(figures: &[Figure]) -> String {
    let mut out = format!(
        "{:<44} {:>12} {:<6} {:>8}  {}\n",
        "figure", "value", "unit", "ratio", "baseline"
    );
    for f in figures {
        let ratio = f.ratio.map(|r| format!("{r:.2}x")).unwrap_or_default();
        out.push_str(&format!(
            "{:<44} {:>12.2} {:<6} {:>8}  {}\n",
            f.name,
            f.value,
            f.unit,
            ratio,
            f.baseline.as_deref().unwrap_or("")
        ));
    }
    out
}

/// The figures as JSON: one object per figure.
pub fn json(figures: &[Figure]) -> serde_json::Value {
    serde_json::Value::Array(
        figures
            .iter()
            .map(|f| {
                serde_json::json!({
                    "name": f.name, "unit": f.unit, "value": f.value,
                    "baseline": f.baseline, "ratio": f.ratio,
                })
            })
            .collect(),
    )
}
