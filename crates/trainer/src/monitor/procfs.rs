//! This process's resident memory and CPU time, from `/proc/self`; the
//! memory the machine, the process's memory cgroup and its address-space
//! limit leave it.

use std::fs;
use std::path::{Path, PathBuf};

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

/// This process's virtual size in bytes (`VmSize` of `/proc/self/status`):
/// what its address-space limit is counted against.
pub fn virtual_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory cgroup of this process: its directory and the names of its
/// limit's and usage's files (cgroup v1's `memory.limit_in_bytes` and
/// `memory.usage_in_bytes`, or v2's `memory.max` and `memory.current`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryCgroup {
    /// The controller's mount: the top of the hierarchy this process sees.
    pub root: PathBuf,
    pub dir: PathBuf,
    pub limit_file: &'static str,
    pub usage_file: &'static str,
}

impl MemoryCgroup {
    /// This process's, from `/proc/self/cgroup`: v1's `memory` line, else
    /// v2's `0::` line; `None` where neither is.
    pub fn of_this_process() -> Option<Self> {
        Self::from_proc(&fs::read_to_string("/proc/self/cgroup").ok()?)
    }

    fn from_proc(cgroups: &str) -> Option<Self> {
        let v1 = cgroups.lines().find_map(|l| {
            let mut fields = l.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            (controllers.split(',').any(|c| c == "memory")).then_some(path)
        });
        let (root, path, limit_file, usage_file) = match v1 {
            Some(path) => (
                "/sys/fs/cgroup/memory",
                path,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ),
            None => {
                let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
                ("/sys/fs/cgroup", path, "memory.max", "memory.current")
            }
        };
        Some(Self {
            root: root.into(),
            dir: Path::new(root).join(path.trim_start_matches('/')),
            limit_file,
            usage_file,
        })
    }

    /// What this cgroup (and every cgroup above it) still lets its
    /// processes take, in bytes, with the limit that leaves the least:
    /// `(limit - usage, limit)`; `None` without a limit (v2's `max`, or
    /// v1's 2⁶³ rounded down to a page).
    pub fn room_bytes(&self) -> Option<(u64, u64)> {
        let mut dir = self.dir.clone();
        let mut least: Option<(u64, u64)> = None;
        loop {
            let read = |name: &str| fs::read_to_string(dir.join(name)).ok();
            if let (Some(limit), Some(usage)) = (read(self.limit_file), read(self.usage_file))
                && let (Ok(limit), Ok(usage)) =
                    (limit.trim().parse::<u64>(), usage.trim().parse::<u64>())
                && limit < 1 << 62
            {
                // The page cache the kernel reclaims first is room too (the
                // working set, as container runtimes count it).
                let reclaimable = read("memory.stat").map_or(0, |s| inactive_file_bytes(&s));
                let room = limit.saturating_sub(usage.saturating_sub(reclaimable));
                if least.is_none_or(|(r, _)| room < r) {
                    least = Some((room, limit));
                }
            }
            if dir == self.root || !dir.pop() {
                return least;
            }
        }
    }
}

/// The inactive file pages a cgroup's `memory.stat` counts (v1's
/// hierarchical `total_inactive_file`, else `inactive_file`); 0 where none.
fn inactive_file_bytes(stat: &str) -> u64 {
    let value = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    };
    value("total_inactive_file")
        .or_else(|| value("inactive_file"))
        .unwrap_or(0)
}

/// [`MemoryCgroup::room_bytes`] of this process's memory cgroup.
pub fn cgroup_room_bytes() -> Option<(u64, u64)> {
    MemoryCgroup::of_this_process()?.room_bytes()
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
    fn reclaimable_page_cache_is_v1s_hierarchical_count_else_v2s() {
        let v1 = "inactive_file 4096\ntotal_inactive_file 8192\n";
        assert_eq!(inactive_file_bytes(v1), 8192);
        assert_eq!(inactive_file_bytes("anon 1\ninactive_file 4096\n"), 4096);
        assert_eq!(inactive_file_bytes("anon 1\n"), 0);
    }

    #[test]
    fn the_memory_cgroup_is_v1s_memory_line_else_v2s() {
        let v2 = MemoryCgroup::from_proc("0::/user.slice/run-r1.scope\n").unwrap();
        assert_eq!(
            (v2.dir, v2.limit_file, v2.usage_file),
            (
                "/sys/fs/cgroup/user.slice/run-r1.scope".into(),
                "memory.max",
                "memory.current"
            )
        );
        let v1 = "12:cpu,cpuacct:/a\n4:memory:/docker/abc\n0::/\n";
        let v1 = MemoryCgroup::from_proc(v1).unwrap();
        assert_eq!(v1.dir, Path::new("/sys/fs/cgroup/memory/docker/abc"));
        assert_eq!(v1.root, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(v1.limit_file, "memory.limit_in_bytes");
        assert_eq!(MemoryCgroup::from_proc("garbage"), None);
        // Whatever this machine's cgroups say, a limit leaves no more than
        // itself.
        if let Some((room, limit)) = cgroup_room_bytes() {
            assert!(room <= limit);
        }
    }

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        assert!(virtual_bytes().unwrap() >= (resident_mib().unwrap() * 1048576.0) as u64);
        assert!(resident_mib().unwrap() > 1.0);
        assert!(cpu_seconds().unwrap() >= 0.0);
    }
}
