//! The CPU time this process, and the children it has waited for, have used: what a load
//! generator spends on each unit of work, the adapter's client stack next to pgbench.

use std::time::Duration;

use anyhow::{Context, Result};

/// The unit of `/proc`'s times: Linux's USER_HZ, which the kernel fixes at 100 for user space
/// (`getconf CLK_TCK`).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time used so far, user and system together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTimes {
    /// Every thread of this process.
    pub(crate) own: Duration,
    /// Children this process has waited for (pgbench, once its run ends).
    pub(crate) children: Duration,
}

impl CpuTimes {
    /// Read from `/proc/self/stat` (fields 14-17 of proc(5): utime, stime, cutime, cstime), at a
    /// tick's resolution (10 ms), which is fine for runs of seconds.
    pub(crate) fn now() -> Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
        // The command name, field 2, may hold spaces and parentheses: field 3 follows its last ')'.
        let after_name = stat
            .rfind(')')
            .context("no command name in /proc/self/stat")?;
        let fields: Vec<&str> = stat[after_name + 1..].split_whitespace().collect();
        let field = |number: usize| -> Result<f64> {
            let text = fields
                .get(number - 3)
                .with_context(|| format!("/proc/self/stat has no field {number}"))?;
            Ok(text.parse::<f64>()?)
        };
        let seconds = |ticks: f64| Duration::from_secs_f64(ticks / TICKS_PER_SECOND);
        Ok(CpuTimes {
            own: seconds(field(14)? + field(15)?),
            children: seconds(field(16)? + field(17)?),
        })
    }

    /// What was used since `earlier`.
    pub(crate) fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            own: self.own.saturating_sub(earlier.own),
            children: self.children.saturating_sub(earlier.children),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Works until the counter moves, within a bound far beyond any scheduler's delay.
    fn until_counted(used: impl Fn(CpuTimes) -> Duration, work: impl Fn()) -> Duration {
        let before = CpuTimes::now().unwrap();
        let started = std::time::Instant::now();
        loop {
            work();
            let counted = used(CpuTimes::now().unwrap().since(before));
            if counted >= Duration::from_millis(20) {
                return counted;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "a minute of work and {counted:?} counted"
            );
        }
    }

    #[test]
    fn work_in_this_process_counts_as_its_own() {
        until_counted(
            |used| used.own,
            || {
                let mut x = 0u64;
                for _ in 0..1_000_000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            },
        );
    }

    #[test]
    fn a_child_waited_for_counts_as_the_childrens() {
        until_counted(
            |used| used.children,
            || {
                let status = std::process::Command::new("sh")
                    .args(["-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"])
                    .status()
                    .unwrap();
                assert!(status.success());
            },
        );
    }
}
