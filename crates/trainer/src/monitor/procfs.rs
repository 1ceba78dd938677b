//! This process's resident memory and CPU time, from `/proc/self`.

use std::fs;

/// Resident memory in MiB (`VmRSS` of `/proc/self/status`).
pub fn resident_mib() -> Option<f64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Memory the machine can still give without swapping, in bytes
/// (`MemAvailable` of `/proc/meminfo`).
pub fn available_bytes() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// This process's address-space limit in bytes (`Max address space` of
/// `/proc/self/limits`, set by `ulimit -v`), `None` when unlimited.
pub fn address_space_limit_bytes() -> Option<u64> {
    parse_address_space_limit(&fs::read_to_string("/proc/self/limits").ok()?)
}

fn parse_address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    // The soft limit: the first value after the name.
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU seconds this process (all its threads) has used, user and system.
pub fn cpu_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_ticks(&stat).map(|ticks| ticks as f64 / clock_ticks_per_second())
}

/// `utime + stime` (fields 14 and 15) of a `/proc/PID/stat` line. The
/// command name (field 2) may hold spaces and parentheses: the fields are
/// counted from after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; it has no
    // preconditions and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let line = "4242 (a (weird) name) R 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3";
        assert_eq!(parse_cpu_ticks(line), Some(300));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn the_address_space_limit_is_the_soft_one() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max address space         6144000000           unlimited            bytes     \n";
        assert_eq!(parse_address_space_limit(limits), Some(6_144_000_000));
        let unlimited = limits.replace("6144000000", "unlimited ");
        assert_eq!(parse_address_space_limit(&unlimited), None);
    }

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        assert!(resident_mib().unwrap() > 1.0);
        assert!(cpu_seconds().unwrap() >= 0.0);
    }
}
