//! The standard `process_*` families of Prometheus' client libraries (CPU seconds, resident and virtual
//! memory, open and maximum file descriptors, start time) and `qc_build_info`, for the controller's and the
//! worker's `/metrics`. Read from `/proc/self` on Linux, as those libraries do; elsewhere only the build
//! info is shown. The parsing is pure ([`parse_stat`]) and unit-tested.

use crate::telemetry::Exposition;

/// What `/proc/self/stat` says of the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// User and system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    /// Start time, in clock ticks after boot.
    pub start_ticks: u64,
    pub virtual_bytes: u64,
    /// Resident set, in pages.
    pub resident_pages: u64,
}

/// Parses `/proc/self/stat` (proc(5)): the fields after the command's closing parenthesis (the command
/// may itself hold spaces and parentheses). None when the text is not one.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first after the command.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n.checked_sub(3)?)?.parse().ok() };
    Some(Stat {
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// The boot time in seconds since the epoch, from `/proc/stat`'s `btime` line.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of open files, from `/proc/self/limits`.
pub fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `qc_build_info` and, on Linux, the `process_*` families into `e`.
pub fn render_into(e: &mut Exposition) {
    e.gauge(
        "qc_build_info",
        "The running build: its version (always 1).",
        &[(&[("version", env!("CARGO_PKG_VERSION"))], 1)],
    );
    #[cfg(target_os = "linux")]
    linux(e);
}

#[cfg(target_os = "linux")]
fn linux(e: &mut Exposition) {
    let Some(stat) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(parse_stat)
    else {
        return;
    };
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let page = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
    e.counter_f64(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        &[(&[], stat.cpu_ticks as f64 / ticks as f64)],
    );
    e.gauge_f64(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        &[(&[], (stat.resident_pages.saturating_mul(page)) as f64)],
    );
    e.gauge_f64(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        &[(&[], stat.virtual_bytes as f64)],
    );
    if let Some(boot) = std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(parse_boot_time)
    {
        e.gauge_f64(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            &[(&[], boot as f64 + stat.start_ticks as f64 / ticks as f64)],
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        e.gauge_f64(
            "process_open_fds",
            "Number of open file descriptors.",
            &[(&[], fds.count() as f64)],
        );
    }
    if let Some(max) = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .as_deref()
        .and_then(parse_max_fds)
    {
        e.gauge_f64(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            &[(&[], max as f64)],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_whatever_it_holds() {
        // A command with a space and a parenthesis; utime 250, stime 50, starttime 7000,
        // vsize 123456789, rss 2048 pages.
        let text = "4242 (qc (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 \
                    7000 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_ticks: 300,
                start_ticks: 7000,
                virtual_bytes: 123_456_789,
                resident_pages: 2048,
            })
        );
        assert_eq!(parse_stat("no parenthesis here"), None);
        assert_eq!(parse_stat("1 (short) S 1 2"), None);
    }

    #[test]
    fn boot_time_and_the_open_files_limit_are_read_from_their_lines() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1765000000\nprocesses 9\n"),
            Some(1_765_000_000)
        );
        assert_eq!(parse_boot_time("cpu 1 2 3\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1048576              1048576              files\n";
        assert_eq!(parse_max_fds(limits), Some(1_048_576));
        assert_eq!(
            parse_max_fds("Max open files unlimited unlimited files\n"),
            None
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_shows_its_cpu_memory_and_files() {
        let mut e = Exposition::new();
        render_into(&mut e);
        let text = e.finish();
        for family in [
            "qc_build_info{version=\"",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(text.contains(family), "{family} missing from:\n{text}");
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(
            rss > 1_000_000.0,
            "a test process holds more than 1 MB: {rss}"
        );
    }
}
