//! Exec handler: one process per message, body on stdin, metadata in `QC_*` environment variables.
//! Each child leads its own process group, so a timeout kills the whole tree the command started.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::{HandlerError, QueueContext, Verdict, verdict_for_exit};
use crate::worker::sqs::Message;

pub struct ExecHandler {
    program: PathBuf,
    args: Vec<String>,
    command: Vec<String>,
    queue: QueueContext,
}

/// Kills the child's process group when the handler future is dropped (timeout, shutdown abort).
struct GroupGuard {
    pgid: Option<rustix::process::Pid>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            // The group may already be gone; nothing to do then.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

impl ExecHandler {
    pub fn new(command: &[String], queue: &QueueContext) -> Result<Self, HandlerError> {
        let first = command.first().ok_or(HandlerError::EmptyCommand)?;
        let program = resolve(first).map_err(|reason| HandlerError::FindCommand {
            command: first.clone(),
            reason,
        })?;
        Ok(ExecHandler {
            program,
            args: command[1..].to_vec(),
            command: command.to_vec(),
            queue: queue.clone(),
        })
    }

    pub fn set_queue_arn(&mut self, arn: &str) {
        self.queue.arn = arn.to_string();
    }

    pub fn command(&self) -> &[String] {
        &self.command
    }

    pub async fn handle(&self, msg: &Message) -> Verdict {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .process_group(0)
            .env("QC_MESSAGE_ID", &msg.id)
            .env("QC_RECEIVE_COUNT", msg.receive_count.to_string())
            .env("QC_QUEUE_URL", &self.queue.url)
            .env("QC_QUEUE_ARN", &self.queue.arn);
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
        for (name, value) in &msg.attributes {
            if let Some(s) = &value.string {
                cmd.env(attribute_env_name(name), s);
            }
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return Verdict::Transient {
                    reason: format!("cannot start {}: {e}", self.program.display()),
                    retry_after: None,
                };
            }
        };
        let mut guard = GroupGuard {
            pgid: child
                .id()
                .and_then(|id| rustix::process::Pid::from_raw(id as i32)),
        };
        let stdin = child.stdin.take();
        let body = msg.body.clone();
        // Feed stdin while waiting: a child that exits without reading its input must not block us.
        let feed = async move {
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(&body).await;
                let _ = stdin.shutdown().await;
            }
        };
        let (_, status) = tokio::join!(feed, child.wait());
        // Reaped: the group id may be reused from now on, so never signal it.
        guard.pgid = None;
        match status {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt;
                verdict_for_exit(status.code(), status.signal())
            }
            Err(e) => Verdict::Transient {
                reason: format!("cannot wait for {}: {e}", self.program.display()),
                retry_after: None,
            },
        }
    }
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

    #[test]
    fn attribute_names_become_env_names() {
        assert_eq!(attribute_env_name("tenant-id"), "QC_ATTR_TENANT_ID");
        assert_eq!(attribute_env_name("a.b_C"), "QC_ATTR_A_B_C");
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
