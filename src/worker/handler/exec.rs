//! Exec handler: one process per message, body on stdin, metadata in `QC_*` environment variables.
//! Each child leads its own process group, killed when the child exits, times out or is abandoned at
//! shutdown; orphans re-parented to the worker (PID 1 in the exec layout) are reaped by `Reaper`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

use super::batch::{self, BatchVerdict};
use super::{HandlerError, QueueContext, Verdict, verdict_for_exit};
use crate::worker::sqs::Message;
use crate::worker::trace::TraceContext;

pub struct ExecHandler {
    /// Pass the static AWS keys on (`--exec-pass-aws-credentials`).
    pass_aws: bool,
    program: PathBuf,
    args: Vec<String>,
    command: Vec<String>,
    queue: QueueContext,
    reaper: Arc<Reaper>,
}

/// Kills the child's process group when the handler future is dropped (timeout, shutdown abort).
/// The leader is not reaped before the kill, so its id still names this group and no other.
struct GroupGuard {
    pgid: Option<rustix::process::Pid>,
    reaper: Arc<Reaper>,
}

impl GroupGuard {
    /// Kills the group; the leader must not be reaped yet.
    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // The group may already be gone; nothing to do then.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }

    /// After the leader was reaped: waits (up to `GROUP_GONE_WAIT`) until no process of the group is
    /// left, the zombies re-parented to the worker included (the reaper collects those). While any
    /// member exists the kernel gives no process that id, so the group still names only ours.
    async fn wait_group_gone(&self) {
        let Some(pgid) = self.pgid else { return };
        let until = tokio::time::Instant::now() + GROUP_GONE_WAIT;
        while rustix::process::test_kill_process_group(pgid).is_ok()
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// The leader was reaped: its id may be reused from now on, so never signal it, and the reaper
    /// may collect a process with that id again.
    fn reaped(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            self.reaper.forget(pgid.as_raw_nonzero().get());
        }
    }
}

/// Longest wait for the rest of a killed group to be gone after its leader was reaped.
const GROUP_GONE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // Dropped unreaped (timeout, shutdown abort): the group goes, and tokio or the reaper
        // collects the leader.
        self.kill();
        self.reaped();
    }
}

/// Reaps the worker's children that no handler call waits for: processes a handler left behind
/// that were re-parented to the worker (it is PID 1 in the exec layout, and a child subreaper
/// elsewhere). Without it they stay zombies for the pod's lifetime.
#[derive(Default)]
pub struct Reaper {
    /// Handler processes whose exit status a handler call collects itself.
    own: Mutex<HashSet<i32>>,
}

impl Reaper {
    /// Makes the worker the reaper of its descendants' orphans and reaps them on every SIGCHLD
    /// (and every few seconds, in case signals were coalesced) until the runtime stops.
    pub fn start(self: &Arc<Self>) {
        if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
            tracing::warn!(error = %e, "cannot become a child subreaper; orphans of handlers are reaped only when the worker is PID 1");
        }
        let me = self.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let mut sigchld = signal(SignalKind::child()).ok();
            loop {
                me.reap();
                let tick = tokio::time::sleep(std::time::Duration::from_secs(5));
                match sigchld.as_mut() {
                    Some(s) => {
                        tokio::select! {
                            _ = s.recv() => {}
                            () = tick => {}
                        }
                    }
                    None => tick.await,
                }
            }
        });
    }

    fn forget(&self, pid: i32) {
        if let Ok(mut own) = self.own.lock() {
            own.remove(&pid);
        }
    }

    /// Reaps every exited child that is not a running handler call's own process.
    pub fn reap(&self) -> usize {
        let Ok(own) = self.own.lock() else { return 0 };
        let mut reaped = 0;
        for pid in children() {
            if own.contains(&pid) {
                continue;
            }
            if let Some(p) = rustix::process::Pid::from_raw(pid)
                && let Ok(Some(_)) =
                    rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG)
            {
                reaped += 1;
            }
        }
        reaped
    }

    /// Kills and reaps every child left (at shutdown, after the handler calls ended), a few rounds so
    /// that grandchildren re-parented meanwhile go too.
    pub async fn kill_strays(&self) {
        for _ in 0..5 {
            let strays: Vec<i32> = {
                let Ok(own) = self.own.lock() else { return };
                children()
                    .into_iter()
                    .filter(|p| !own.contains(p))
                    .collect()
            };
            if strays.is_empty() {
                return;
            }
            tracing::warn!(
                count = strays.len(),
                "killing processes handlers left behind"
            );
            for pid in strays {
                if let Some(p) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            self.reap();
        }
    }
}

/// The worker's child processes, from /proc (the 4th field of /proc/PID/stat is the parent).
fn children() -> Vec<i32> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_of(&stat))
                == Some(me)
        })
        .collect()
}

/// The parent id in a /proc/PID/stat line; the command name in parentheses may hold anything.
fn parent_of(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

impl ExecHandler {
    pub fn new(command: &[String], queue: &QueueContext) -> Result<Self, HandlerError> {
        let first = command.first().ok_or(HandlerError::EmptyCommand)?;
        let program = resolve(first).map_err(|reason| HandlerError::FindCommand {
            command: first.clone(),
            reason,
        })?;
        Ok(ExecHandler {
            pass_aws: false,
            program,
            args: command[1..].to_vec(),
            command: command.to_vec(),
            queue: queue.clone(),
            reaper: Arc::new(Reaper::default()),
        })
    }

    pub fn set_queue_arn(&mut self, arn: &str) {
        self.queue.arn = arn.to_string();
    }

    /// Whether the handler's processes get the static AWS keys of the worker's environment.
    pub fn pass_aws_credentials(&mut self, pass: bool) {
        self.pass_aws = pass;
        let held: Vec<&str> = AWS_KEYS
            .iter()
            .copied()
            .filter(|k| std::env::var_os(k).is_some())
            .collect();
        if !pass && !held.is_empty() {
            tracing::info!(withheld = %held.join(","), "exec handler: static AWS keys of the worker's environment are not passed to the handler's processes; set handler.exec.passAwsCredentials (--exec-pass-aws-credentials) if it needs them");
        }
    }

    pub fn command(&self) -> &[String] {
        &self.command
    }

    pub fn reaper(&self) -> &Arc<Reaper> {
        &self.reaper
    }

    /// Runs the command for `msg`; None if it was still running at `deadline`, returned after its
    /// process group was killed and its leader reaped.
    pub async fn handle(&self, msg: &Message, deadline: tokio::time::Instant) -> Option<Verdict> {
        let mut cmd = self.command_for();
        cmd.env("QC_MESSAGE_ID", &msg.id)
            .env("QC_RECEIVE_COUNT", msg.receive_count.to_string());
        if let Some(g) = &msg.group_id {
            cmd.env("QC_MESSAGE_GROUP_ID", g);
        }
        if let Some(d) = &msg.deduplication_id {
            cmd.env("QC_DEDUPLICATION_ID", d);
        }
        if let Some(s) = &msg.sequence_number {
            cmd.env("QC_SEQUENCE_NUMBER", s);
        }
        if let Some(t) = msg.sent_timestamp {
            cmd.env("QC_SENT_TIMESTAMP", t.to_string());
        }
        let trace = TraceContext::of_message(msg);
        if let Some(tp) = &trace.traceparent {
            cmd.env("TRACEPARENT", tp);
        }
        if let Some(ts) = &trace.tracestate {
            cmd.env("TRACESTATE", ts);
        }
        if let Some(x) = &trace.xray {
            cmd.env("_X_AMZN_TRACE_ID", x);
        }
        // String and Number attributes as text, Binary ones base64 (standard alphabet, padded). Of
        // names that map to the same variable, the first in the message's (sorted) order is set.
        let mut set = HashSet::new();
        let mut with_nul = Vec::new();
        for (name, value) in &msg.attributes {
            let env = attribute_env_name(name);
            if set.contains(&env) {
                continue;
            }
            match (&value.string, &value.binary) {
                (Some(s), _) if s.contains('\0') => {
                    with_nul.push(name.as_str());
                    continue;
                }
                (Some(s), _) => cmd.env(&env, s),
                (None, Some(b)) => {
                    use base64::Engine as _;
                    cmd.env(&env, base64::engine::general_purpose::STANDARD.encode(b))
                }
                (None, None) => continue,
            };
            set.insert(env);
        }
        if !with_nul.is_empty() {
            // The message's own bytes: it can never be started, however often it is retried, and
            // it says nothing of the handler's dependency (the breaker must not count it).
            return Some(Verdict::Poison(format!(
                "message attribute {} holds a NUL byte, which no process environment can carry; \
                 an HTTP handler receives it percent-encoded",
                with_nul.join(", ")
            )));
        }
        let from_message = !set.is_empty();
        match self
            .run(cmd, msg.body.clone(), from_message, deadline)
            .await?
        {
            Ran::Exited(status) => {
                use std::os::unix::process::ExitStatusExt;
                Some(verdict_for_exit(status.code(), status.signal()))
            }
            Ran::NotRun(v) => Some(v),
        }
    }

    /// Batch mode: one process for all of `msgs`, one structured CloudEvent a line on stdin. The
    /// answer is the file named by `QC_BATCH_ANSWER_FILE` (in a private directory made for this
    /// call, read once the process exited and removed with it), never stdout: stdout is the
    /// handler's log, as in single mode, so no message body it prints can pose as the answer and no
    /// process holding stdout open can delay or lose it. Exit 0 reads the file (`batch::answered`:
    /// no file, an unreadable or malformed one retries every item); any other exit is the verdict
    /// of every item. None if it was still running at `deadline`.
    pub async fn handle_batch(
        &self,
        msgs: &[&Message],
        deadline: tokio::time::Instant,
    ) -> Option<BatchVerdict> {
        let dir = match AnswerDir::create(&std::env::temp_dir()) {
            Ok(dir) => dir,
            Err(e) => {
                // Never run a batch whose answer could not be read: its items would all be retried
                // after the work was done. Counted by the breaker, which holds the items meanwhile.
                let reason = format!(
                    "cannot create the batch answer directory in {}: {e}; set TMPDIR to a writable directory (e.g. an emptyDir volume)",
                    std::env::temp_dir().display()
                );
                tracing::error!(reason = %reason, "exec batch handler not started");
                return Some(BatchVerdict::Whole(Verdict::Transient {
                    reason,
                    retry_after: None,
                    cause: super::Cause::Downstream,
                }));
            }
        };
        let mut cmd = self.command_for();
        cmd.env("QC_BATCH_SIZE", msgs.len().to_string())
            .env(batch::ANSWER_FILE_ENV, dir.file());
        let input = bytes::Bytes::from(batch::json_lines(msgs, self.source()));
        match self.run(cmd, input, false, deadline).await? {
            Ran::Exited(status) => {
                use std::os::unix::process::ExitStatusExt;
                let verdict = verdict_for_exit(status.code(), status.signal());
                if verdict != Verdict::Success {
                    return Some(BatchVerdict::whole(verdict));
                }
                let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
                let read = dir.read();
                let file = match &read {
                    Ok(Some(bytes)) => batch::AnswerFile::Written(bytes),
                    Ok(None) => batch::AnswerFile::Missing,
                    Err(why) => batch::AnswerFile::Unreadable(why),
                };
                Some(batch::answered(
                    batch::Answer::ExecFile(file),
                    &ids,
                    &self.program.display().to_string(),
                ))
            }
            Ran::NotRun(v) => Some(BatchVerdict::whole(v)),
        }
    }

    /// `ce-source` of batch events: the queue ARN, the URL until the ARN is known.
    fn source(&self) -> &str {
        if self.queue.arn.is_empty() {
            &self.queue.url
        } else {
            &self.queue.arn
        }
    }

    /// The command with what every call shares: its own process group, stdin piped, stdout and
    /// stderr the worker's own (the handler's log, never read), the queue.
    fn command_for(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .process_group(0)
            .env("QC_QUEUE_URL", &self.queue.url)
            .env("QC_QUEUE_ARN", &self.queue.arn);
        for name in WORKER_SECRETS {
            cmd.env_remove(name);
        }
        if !self.pass_aws {
            for name in AWS_KEYS {
                cmd.env_remove(name);
            }
        }
        cmd
    }

    /// Spawns `cmd` with `input` on stdin and waits for it (up to `deadline`, then its process group
    /// is killed and its leader reaped: None). `from_message`: the environment holds the message's
    /// attributes (a start failure for its size is then the message's).
    async fn run(
        &self,
        mut cmd: tokio::process::Command,
        input: bytes::Bytes,
        from_message: bool,
        deadline: tokio::time::Instant,
    ) -> Option<Ran> {
        let spawned = {
            // Registered under the lock, so the reaper never collects this child's exit status.
            let mut own = self
                .reaper
                .own
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let spawned = cmd.spawn();
            if let Ok(c) = &spawned
                && let Some(id) = c.id().and_then(|id| i32::try_from(id).ok())
            {
                own.insert(id);
            }
            spawned
        };
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => return Some(Ran::NotRun(start_failure(&e, from_message, &self.program))),
        };
        let pid = child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(i32::try_from(id).ok()?));
        let mut guard = GroupGuard {
            pgid: pid,
            reaper: self.reaper.clone(),
        };
        let stdin = child.stdin.take();
        let body = input;
        // Feed stdin while waiting: a child that exits without reading its input must not block us.
        let feed = async move {
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(&body).await;
                let _ = stdin.shutdown().await;
            }
        };
        let timer = tokio::time::sleep_until(deadline);
        tokio::pin!(timer);
        let status = if let Some(watch) = pid.and_then(exit_watch) {
            // Wait for the exit (or the deadline) without reaping, kill what is left in the
            // group, then reap. A child that exits without reading all its input ends the feeding.
            let exit = watch.readable();
            tokio::pin!(exit);
            let timed_out = tokio::select! {
                _ = &mut exit => false,
                () = &mut timer => true,
                () = feed => tokio::select! {
                    _ = &mut exit => false,
                    () = &mut timer => true,
                },
            };
            guard.kill();
            let status = child.wait().await;
            if timed_out {
                guard.wait_group_gone().await;
                guard.reaped();
                return None;
            }
            guard.reaped();
            status
        } else {
            let waited = tokio::select! {
                ((), status) = async { tokio::join!(feed, child.wait()) } => Some(status),
                () = &mut timer => None,
            };
            if let Some(status) = waited {
                guard.reaped();
                status
            } else {
                // Not reaped yet (the wait did not finish): the group id is still the child's.
                if !matches!(child.try_wait(), Ok(Some(_))) {
                    guard.kill();
                    let _ = child.wait().await;
                    guard.wait_group_gone().await;
                }
                guard.reaped();
                return None;
            }
        };
        Some(match status {
            Ok(status) => Ran::Exited(status),
            Err(e) => Ran::NotRun(Verdict::Transient {
                reason: format!("cannot wait for {}: {e}", self.program.display()),
                retry_after: None,
                cause: super::Cause::Downstream,
            }),
        })
    }
}

/// The verdict of a command that could not be started. The message's own bytes are poison, never a
/// dependency failure (#40: one forged attribute must not open the outage breaker and stop every
/// other message): data the standard library refuses to pass to a process at all (a NUL byte in an
/// argument or variable), and an environment past the kernel's limits (E2BIG: 128 KiB a variable
/// on Linux, about a quarter of the stack limit in all) when the message's attributes are in it.
/// A program that is missing, not executable or not loadable, E2BIG without the message's
/// attributes (the worker's own environment is too large), and a lack of processes, memory or file
/// descriptors are the handler's set-up: transient, counted by the breaker.
fn start_failure(e: &std::io::Error, from_message: bool, program: &Path) -> Verdict {
    match e.kind() {
        std::io::ErrorKind::ArgumentListTooLong if from_message => Verdict::Poison(format!(
            "the message's attributes are too large for the handler's environment ({e}); \
             an HTTP handler takes attributes of any size"
        )),
        // No OS error: refused before any exec (a NUL byte), so only the data can be at fault;
        // EINVAL from execve itself (a malformed executable) is the program's.
        std::io::ErrorKind::InvalidInput if e.raw_os_error().is_none() => Verdict::Poison(format!(
            "the message's data cannot be passed to a process ({e})"
        )),
        _ => Verdict::Transient {
            reason: format!("cannot start {}: {e}", program.display()),
            retry_after: None,
            cause: super::Cause::Downstream,
        },
    }
}

/// The worker's own secrets, never in a handler process's environment.
pub const WORKER_SECRETS: &[&str] = &["QC_REDIS_URL"];
/// Static AWS keys, in a handler process's environment only with `--exec-pass-aws-credentials`
/// (a pod identity's pointers, AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE and
/// AWS_CONTAINER_CREDENTIALS_FULL_URI, are no secret and stay).
pub const AWS_KEYS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
];

/// How a `run` ended.
enum Ran {
    /// The child exited.
    Exited(std::process::ExitStatus),
    /// It could not be started or waited for.
    NotRun(Verdict),
}

/// A batch answer file larger than this is unreadable (a batch of 100 items, the most, needs a few
/// KiB; an HTTP answer body has the same cap).
const MAX_ANSWER: u64 = 1024 * 1024;

/// The private directory of one exec batch call: made 0700 by the worker, so only the worker's user
/// reaches the answer file in it; holds `answer.json` once the handler writes it. Removed, with
/// whatever is in it, when the call ends (dropped), so an answer written late by a process the
/// handler left behind is never read, by this call or another.
struct AnswerDir {
    dir: PathBuf,
}

impl AnswerDir {
    fn create(base: &Path) -> std::io::Result<AnswerDir> {
        use std::os::unix::fs::DirBuilderExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let mut last = None;
        for _ in 0..16 {
            let nonce = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = base.join(format!(
                "qc-batch-{pid}-{}-{nonce:08x}",
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            // mkdir fails on anything already there (a symlink included): the directory is ours.
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(AnswerDir { dir }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free directory name")))
    }

    fn file(&self) -> PathBuf {
        self.dir.join("answer.json")
    }

    /// The answer file's bytes: None if the handler wrote none, Err if it cannot be read (not a
    /// regular file, a symlink, larger than `MAX_ANSWER`, an I/O error).
    fn read(&self) -> Result<Option<Vec<u8>>, String> {
        use std::io::Read as _;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.file();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(ANSWER_OPEN_FLAGS)
            .open(&path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if meta.len() > MAX_ANSWER {
            return Err(format!(
                "{} holds {} bytes, more than the {MAX_ANSWER} an answer may",
                path.display(),
                meta.len()
            ));
        }
        let mut bytes = Vec::new();
        file.take(MAX_ANSWER + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if bytes.len() as u64 > MAX_ANSWER {
            return Err(format!(
                "{} grew past the {MAX_ANSWER} bytes an answer may hold",
                path.display()
            ));
        }
        Ok(Some(bytes))
    }
}

impl Drop for AnswerDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove a batch answer directory");
        }
    }
}

/// The answer file is opened only if it is no symlink (O_NOFOLLOW), and without waiting for a writer
/// if it is a FIFO (O_NONBLOCK; then refused as no regular file).
const ANSWER_OPEN_FLAGS: i32 = rustix::fs::OFlags::NOFOLLOW
    .union(rustix::fs::OFlags::NONBLOCK)
    .bits()
    .cast_signed();

/// A pidfd of the process: readable once it has exited, without reaping it (the zombie keeps its
/// group id reserved, so the group can still be killed safely). None without pidfd support.
fn exit_watch(pid: rustix::process::Pid) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
    // Deprecated because a borrowed descriptor could be closed while registered; this one is owned
    // by the AsyncFd and closed only when it is dropped (the safe replacement is an `unsafe fn`).
    #[allow(deprecated)]
    tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE).ok()
}

/// `QC_ATTR_` plus the attribute name upper-cased, with anything but letters and digits as `_`.
pub fn attribute_env_name(name: &str) -> String {
    let mut out = String::with_capacity(8 + name.len());
    out.push_str("QC_ATTR_");
    for c in name.chars() {
        out.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        });
    }
    out
}

/// Finds the program as a shell would: a path as given, a bare name on PATH.
fn resolve(program: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        let p = Path::new(program);
        return if is_executable(p) {
            Ok(p.to_path_buf())
        } else {
            Err("no executable file at that path".into())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| "not on PATH".into())
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::sqs::AttributeValue;

    fn message() -> Message {
        Message::test(b"{}")
    }

    /// Process state from /proc (None: gone, reaped).
    fn state(pid: &str) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 1..].trim_start().chars().next()
    }

    /// The call returns at its deadline only once the command is killed with its group and reaped,
    /// so an idempotency claim held until then outlives the handler.
    #[tokio::test]
    async fn a_command_past_its_deadline_is_killed_with_its_group_and_reaped_before_the_call_returns()
     {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let script = format!(
            "echo $$ > {p}; sleep 30 & echo $! >> {p}; wait",
            p = pids.display()
        );
        let h = ExecHandler::new(
            &["sh".to_string(), "-c".to_string(), script],
            &QueueContext::default(),
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(500);
        assert_eq!(h.handle(&message(), deadline).await, None, "timed out");
        let pids = std::fs::read_to_string(&pids).unwrap();
        let pids: Vec<&str> = pids.lines().collect();
        assert_eq!(pids.len(), 2, "{pids:?}");
        assert_eq!(state(pids[0]), None, "the leader is reaped");
        // The grandchild was killed with the group (a zombie until whoever adopted it reaps it).
        assert!(
            matches!(state(pids[1]), None | Some('Z')),
            "{:?}",
            state(pids[1])
        );
        // A command that ends in time is not cut.
        let h = ExecHandler::new(&["true".to_string()], &QueueContext::default()).unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        assert_eq!(h.handle(&message(), deadline).await, Some(Verdict::Success));
    }

    /// #29 item 7: an attribute past the kernel's 128 KiB a variable cannot reach an exec handler;
    /// the message is poison with the reason, not a transient failure retried into the DLQ (and
    /// counted against the outage breaker on the way).
    #[tokio::test]
    async fn an_attribute_too_large_for_the_environment_is_poison() {
        let h = ExecHandler::new(&["true".to_string()], &QueueContext::default()).unwrap();
        let msg = Message {
            attributes: vec![(
                "blob".to_string(),
                AttributeValue::string("x".repeat(200 * 1024)),
            )],
            ..Message::test(b"{}")
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        match h.handle(&msg, deadline).await {
            Some(Verdict::Poison(reason)) => {
                assert!(
                    reason.contains("too large for the handler's environment"),
                    "{reason}"
                );
            }
            other => panic!("expected poison, got {other:?}"),
        }
        // Within the limit it runs.
        let msg = Message {
            attributes: vec![("blob".to_string(), AttributeValue::string("x".repeat(1024)))],
            ..Message::test(b"{}")
        };
        assert_eq!(h.handle(&msg, deadline).await, Some(Verdict::Success));
    }

    /// #40: an SNS attribute holding a NUL byte cannot reach a process; that is the message's
    /// fault (poison, with the attribute named), never a start failure the breaker counts.
    #[tokio::test]
    async fn an_attribute_holding_a_nul_byte_is_poison() {
        let h = ExecHandler::new(&["true".to_string()], &QueueContext::default()).unwrap();
        let msg = Message {
            attributes: vec![
                ("ok".to_string(), AttributeValue::string("fine")),
                ("tenant".to_string(), AttributeValue::string("a\0b")),
            ],
            ..Message::test(b"{}")
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        match h.handle(&msg, deadline).await {
            Some(Verdict::Poison(reason)) => {
                assert!(
                    reason.contains("tenant") && reason.contains("NUL"),
                    "{reason}"
                );
                assert!(!reason.contains("ok,"), "{reason}");
            }
            other => panic!("expected poison, got {other:?}"),
        }
    }

    /// Start failures by whose fault they are: the message's bytes are poison, the program's set-up
    /// a transient failure the outage breaker counts.
    #[test]
    fn start_failures_are_poison_only_when_the_message_causes_them() {
        use std::io::{Error, ErrorKind};
        let p = Path::new("/app/handle");
        let poison = |v: &Verdict| matches!(v, Verdict::Poison(_));
        let downstream = |v: &Verdict| {
            matches!(
                v,
                Verdict::Transient {
                    cause: super::super::Cause::Downstream,
                    ..
                }
            )
        };
        for (e, from_message, want_poison) in [
            // E2BIG with the message's attributes in the environment; without them it is the
            // worker's own environment.
            (Error::from_raw_os_error(7), true, true),
            (Error::from_raw_os_error(7), false, false),
            // The standard library refuses a NUL byte before any exec.
            (
                Error::new(ErrorKind::InvalidInput, "nul byte found in provided data"),
                true,
                true,
            ),
            (
                Error::new(ErrorKind::InvalidInput, "nul byte found in provided data"),
                false,
                true,
            ),
            // EINVAL from execve (a malformed executable), ENOENT, EACCES, ENOEXEC, ETXTBSY,
            // EAGAIN, ENOMEM, EMFILE: the program or the machine.
            (Error::from_raw_os_error(22), true, false),
            (Error::from_raw_os_error(2), true, false),
            (Error::from_raw_os_error(13), true, false),
            (Error::from_raw_os_error(8), true, false),
            (Error::from_raw_os_error(26), true, false),
            (Error::from_raw_os_error(11), true, false),
            (Error::from_raw_os_error(12), true, false),
            (Error::from_raw_os_error(24), true, false),
        ] {
            let v = start_failure(&e, from_message, p);
            if want_poison {
                assert!(poison(&v), "{e} ({from_message}): {v:?}");
            } else {
                assert!(downstream(&v), "{e} ({from_message}): {v:?}");
                let Verdict::Transient { reason, .. } = v else {
                    unreachable!()
                };
                assert!(reason.contains("/app/handle"), "{reason}");
            }
        }
    }

    fn sh(script: &str) -> ExecHandler {
        ExecHandler::new(
            &["sh".to_string(), "-c".to_string(), script.to_string()],
            &QueueContext::default(),
        )
        .unwrap()
    }

    fn batch_of(ids: &[&str]) -> Vec<Message> {
        ids.iter()
            .map(|id| Message {
                id: (*id).to_string(),
                ..Message::test(b"{}")
            })
            .collect()
    }

    async fn call(h: &ExecHandler, msgs: &[Message]) -> Option<BatchVerdict> {
        let refs: Vec<&Message> = msgs.iter().collect();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        h.handle_batch(&refs, deadline).await
    }

    fn retried_whole(v: Option<BatchVerdict>) -> String {
        match v {
            Some(BatchVerdict::Whole(Verdict::Transient { reason, .. })) => reason,
            other => panic!("expected every item retried, got {other:?}"),
        }
    }

    /// #40: the answer is the file `QC_BATCH_ANSWER_FILE` names; stdout is the handler's log.
    #[tokio::test]
    async fn a_batch_answer_is_read_from_its_file_never_from_stdout() {
        let msgs = batch_of(&["a", "b", "c"]);
        let h = sh(
            r#"echo '{"batchItemFailures":[{"itemIdentifier":"b"}]}' > "$QC_BATCH_ANSWER_FILE""#,
        );
        assert_eq!(
            call(&h, &msgs).await,
            Some(BatchVerdict::Items { failed: vec![1] })
        );
        let h = sh(r#"echo '{}' > "$QC_BATCH_ANSWER_FILE""#);
        assert_eq!(
            call(&h, &msgs).await,
            Some(BatchVerdict::Items { failed: vec![] })
        );
        // An answer on stdout, the old contract, is a log line: no answer, every item retried.
        let h = sh(r#"echo '{"batchItemFailures":[]}'"#);
        let reason = retried_whole(call(&h, &msgs).await);
        assert!(reason.contains("QC_BATCH_ANSWER_FILE"), "{reason}");
        // A body logged after the answer changes nothing.
        let h = sh(
            r#"echo '{"batchItemFailures":[{"itemIdentifier":"a"},{"itemIdentifier":"c"}]}' > "$QC_BATCH_ANSWER_FILE"; echo '{"batchItemFailures":[]}'"#,
        );
        assert_eq!(
            call(&h, &msgs).await,
            Some(BatchVerdict::Items { failed: vec![0, 2] })
        );
        // Exit 0 with nothing written, an empty file, a half-written one: every item retried.
        for script in [
            "true",
            r#": > "$QC_BATCH_ANSWER_FILE""#,
            r#"printf '{"batchItemFailures":[' > "$QC_BATCH_ANSWER_FILE""#,
            r#"mkdir "$QC_BATCH_ANSWER_FILE""#,
            r#"ln -s /etc/hostname "$QC_BATCH_ANSWER_FILE""#,
            r#"mkfifo "$QC_BATCH_ANSWER_FILE""#,
            r#"head -c 1100000 /dev/zero | tr '\0' ' ' > "$QC_BATCH_ANSWER_FILE""#,
        ] {
            retried_whole(call(&sh(script), &msgs).await);
        }
        // A failing exit decides for every item whatever the file says.
        let h = sh(r#"echo '{}' > "$QC_BATCH_ANSWER_FILE"; exit 1"#);
        retried_whole(call(&h, &msgs).await);
    }

    /// #40: a process the handler leaves holding stdout (a helper in a new session) neither delays
    /// the answer nor loses it: the file is read once the handler exited.
    #[tokio::test]
    async fn a_process_holding_stdout_neither_delays_nor_loses_the_answer() {
        let msgs = batch_of(&["a", "b"]);
        let h = sh(
            r#"setsid sleep 5 & echo '{"batchItemFailures":[{"itemIdentifier":"a"},{"itemIdentifier":"b"}]}' > "$QC_BATCH_ANSWER_FILE""#,
        );
        let started = std::time::Instant::now();
        assert_eq!(
            call(&h, &msgs).await,
            Some(BatchVerdict::Items { failed: vec![0, 1] })
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    /// The answer directory is private (0700), one per call, and gone once the call ended.
    #[tokio::test]
    async fn each_call_gets_a_private_answer_directory_removed_afterwards() {
        let seen = tempfile::tempdir().unwrap();
        let log = seen.path().join("log");
        let h = sh(&format!(
            r#"d=$(dirname "$QC_BATCH_ANSWER_FILE"); stat -c %a "$d" >> {log}; echo "$d" >> {log}; echo '{{}}' > "$QC_BATCH_ANSWER_FILE""#,
            log = log.display()
        ));
        let msgs = batch_of(&["a"]);
        for _ in 0..2 {
            assert_eq!(
                call(&h, &msgs).await,
                Some(BatchVerdict::Items { failed: vec![] })
            );
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!((lines[0], lines[2]), ("700", "700"));
        assert_ne!(lines[1], lines[3], "one directory a call");
        for dir in [lines[1], lines[3]] {
            assert!(!Path::new(dir).exists(), "{dir} removed");
        }
        // A single-message call gets no answer file.
        let h = sh(r#"test -z "$QC_BATCH_ANSWER_FILE""#);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        assert_eq!(h.handle(&message(), deadline).await, Some(Verdict::Success));
    }

    #[test]
    fn attribute_names_become_env_names() {
        assert_eq!(attribute_env_name("tenant-id"), "QC_ATTR_TENANT_ID");
        assert_eq!(attribute_env_name("a.b_C"), "QC_ATTR_A_B_C");
    }

    #[test]
    fn the_parent_is_read_after_the_command_name() {
        assert_eq!(parent_of("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_of("42 (a) b) (c) Z 9 1 1"), Some(9));
        assert_eq!(parent_of("garbage"), None);
    }

    #[test]
    fn commands_resolve_on_path_or_fail_clearly() {
        assert!(resolve("sh").is_ok());
        assert!(resolve("/bin/sh").is_ok());
        assert_eq!(
            resolve("/nonexistent/x").unwrap_err(),
            "no executable file at that path"
        );
        assert_eq!(resolve("no-such-command-qc").unwrap_err(), "not on PATH");
    }
}
