//! The CPU time this process, and the children it has waited for, have used: what a load
//! generator spends on each unit of work, the adapter's client stack next to pgbench.

use std::time::Duration;

use anyhow::{Context, Result};

/// The unit of `/proc`'s times: Linux's USER_HZ, which the kernel fixes at 100 for user space
/// (`getconf CLK_TCK`).
const TICKS_PER_SECOND: u32 = 100;

/// CPU time used so far, user and system together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTimes {
    /// Every thread of this process.
    pub(crate) own: Duration,
    /// Children this process has waited for (pgbench, once its run ends).
    pub(crate) children: Duration,
}

impl CpuTimes {
    /// Read from `/proc/self/stat` at a tick's resolution (10 ms), which is fine for runs of
    /// seconds.
    pub(crate) fn now() -> Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
        CpuTimes::parse(&stat)
    }

    /// Fields 14-17 of proc(5)'s `stat` line: utime, stime, cutime, cstime, in ticks.
    fn parse(stat: &str) -> Result<CpuTimes> {
        let field = |number: usize| stat_field(stat, number);
        let seconds = |ticks: u64| Duration::from_secs(ticks) / TICKS_PER_SECOND;
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

/// Numeric field `number` (3 or more, counted from 1 as proc(5) counts them) of a `stat` line.
pub(crate) fn stat_field(stat: &str, number: usize) -> Result<u64> {
    // The command name, field 2, may hold spaces and parentheses: field 3 follows its last ')'.
    let after_name = stat
        .rfind(')')
        .context("no command name in the stat line")?;
    let after = number
        .checked_sub(3)
        .with_context(|| format!("field {number} is not a number of the stat line"))?;
    let text = stat[after_name + 1..]
        .split_whitespace()
        .nth(after)
        .with_context(|| format!("the stat line has no field {number}"))?;
    Ok(text.parse::<u64>()?)
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
    fn the_four_times_are_read_from_their_fields_after_the_command_name() {
        // A command name with a space and parentheses; utime 7, stime 11, cutime 300, cstime 5.
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 10 0 0 0 7 11 300 5 20 0 3 0 99";
        let times = CpuTimes::parse(line).unwrap();
        assert_eq!(times.own, Duration::from_millis(180));
        assert_eq!(times.children, Duration::from_millis(3050));
        assert!(CpuTimes::parse("4242 (short) S 1 2").is_err());
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
