//! The worker's spans when tracing is on (`telemetry::otlp`): one trace per message, a `qc.message`
//! span from receipt to its end with children for the wait for a slot, the handler call and the settle.
//!
//! The producer's context (a `traceparent` attribute, else `AWSTraceHeader`, as `worker::trace`
//! reads them) is the parent of `qc.message`, not a link: the message's spans, and the handler's
//! under `qc.handle`, stay in the producer's trace, the trace the handler's spans were already in
//! before the worker made spans of its own. A message without one gets a trace of its own, whose id
//! comes from the message id: every delivery of the message (a retry) is in that one trace.
//! Tracing off: no `Spans` exists and a lease carries no `MessageSpan`, so nothing here runs.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use super::core::fate::Fate;
use super::handler::Verdict;
use super::sqs::Message;
use super::trace::TraceContext;

/// Makes the spans of this worker's messages.
#[derive(Clone, Debug)]
pub struct Spans {
    tracer: SdkTracer,
    /// `messaging.destination.name`: the queue's name.
    queue: String,
}

/// A message's `qc.message` span, in the context its children are made in.
#[derive(Debug)]
pub struct MessageSpan {
    cx: Context,
    /// When the message was received: `qc.message` and `qc.wait` start then.
    received: SystemTime,
}

/// A child span running (the handler call or a settle), ended by its `end_*`.
pub struct Child {
    cx: Context,
}

impl Spans {
    pub fn new(tracer: SdkTracer, queue_url: &str) -> Spans {
        let queue = queue_url
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(queue_url)
            .to_string();
        Spans { tracer, queue }
    }

    /// `qc.message`, started at the message's receipt, a child of the producer's context if it has one.
    pub fn message(&self, msg: &Message) -> MessageSpan {
        let parent = producer_context(&TraceContext::of_message_attributes(msg));
        let received = SystemTime::now()
            .checked_sub(msg.received_at.elapsed())
            .unwrap_or_else(SystemTime::now);
        // No attribute before the sampler's decision (ours read none): a message not sampled costs no
        // attribute built.
        let builder = self
            .tracer
            .span_builder("qc.message")
            .with_kind(SpanKind::Consumer)
            .with_start_time(received);
        let mut span = crate::telemetry::otlp::with_trace_id(message_trace_id(&msg.id), || {
            builder.start_with_context(&self.tracer, &parent)
        });
        if opentelemetry::trace::Span::is_recording(&span) {
            let mut attributes = vec![
                KeyValue::new("messaging.system", "aws_sqs"),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.destination.name", self.queue.clone()),
                KeyValue::new("messaging.message.id", msg.id.clone()),
                KeyValue::new(
                    "messaging.message.body.size",
                    i64::try_from(msg.body.len()).unwrap_or(i64::MAX),
                ),
                KeyValue::new("qc.receive_count", i64::from(msg.receive_count)),
            ];
            if let Some(g) = &msg.group_id {
                attributes.push(KeyValue::new("qc.message_group_id", g.clone()));
            }
            // The time in the queue before this receipt (SentTimestamp to it; a redelivery's includes
            // its earlier deliveries): the span starts at the receipt, so this is where a trace shows it.
            if let Some(sent) = msg.sent_timestamp {
                let received_ms = received
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                attributes.push(KeyValue::new(
                    "qc.queue_time_ms",
                    i64::try_from(received_ms.saturating_sub(sent)).unwrap_or(i64::MAX),
                ));
            }
            opentelemetry::trace::Span::set_attributes(&mut span, attributes);
        }
        MessageSpan {
            cx: parent.with_span(span),
            received,
        }
    }

    /// `qc.wait`: from the receipt until a slot took the message (ended now).
    pub fn waited(&self, m: &MessageSpan) {
        if !m.recording() {
            return;
        }
        let mut span = self
            .tracer
            .span_builder("qc.wait")
            .with_kind(SpanKind::Internal)
            .with_start_time(m.received)
            .start_with_context(&self.tracer, &m.cx);
        opentelemetry::trace::Span::end(&mut span);
    }

    /// `qc.handle`, the handler call, started now. Its context is what the handler gets as
    /// `traceparent` (`handler_traceparent`).
    pub fn handle(&self, m: &MessageSpan) -> Child {
        self.child(m, "qc.handle", SpanKind::Client, Vec::new())
    }

    /// The settle of `fate`, started now: `qc.delete`, `qc.retry`, `qc.dead_letter`, ...
    pub fn settle(&self, m: &MessageSpan, fate: &Fate) -> Child {
        let name = fate_name(fate);
        if !m.recording() {
            return Child { cx: m.cx.clone() };
        }
        m.cx.span().set_attribute(KeyValue::new("qc.outcome", name));
        let mut attributes = vec![KeyValue::new("messaging.operation.type", "settle")];
        if let Fate::RetryAfter { delay, .. } | Fate::Hide(delay) | Fate::Leave(delay) = fate {
            attributes.push(KeyValue::new(
                "qc.visibility_timeout_s",
                i64::from(super::core::backoff::visibility_secs(*delay)),
            ));
        }
        self.child(m, &format!("qc.{name}"), SpanKind::Client, attributes)
    }

    fn child(
        &self,
        m: &MessageSpan,
        name: &str,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Child {
        if !m.recording() {
            // Not sampled: no child is made; the handler gets the message span's context (flags 00).
            return Child { cx: m.cx.clone() };
        }
        let span = self
            .tracer
            .span_builder(name.to_string())
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &m.cx);
        Child {
            cx: m.cx.with_span(span),
        }
    }
}

impl MessageSpan {
    fn recording(&self) -> bool {
        self.cx.span().is_recording()
    }

    /// Ends `qc.message` (dropping it would too: a lease ended without a settle, e.g. on shutdown).
    pub fn end(&self) {
        self.cx.span().end();
    }
}

impl Child {
    /// The `traceparent` a handler gets for this call: this span's context.
    pub fn traceparent(&self) -> String {
        let sc = self.cx.span().span_context().clone();
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    }

    /// Ends the handler call's span with what the handler said.
    pub fn end_handle(self, verdict: &Verdict, timed_out: bool) {
        let span = self.cx.span();
        if !span.is_recording() {
            return;
        }
        let (what, error): (&str, Option<Cow<'_, str>>) = match verdict {
            Verdict::Success => ("success", None),
            Verdict::Poison(r) => ("poison", Some(r.into())),
            Verdict::Transient { reason, .. } if timed_out => ("timeout", Some(reason.into())),
            Verdict::Transient { reason, .. } => ("transient", Some(reason.into())),
            Verdict::Unreachable(r) => ("unreachable", Some(r.into())),
        };
        span.set_attribute(KeyValue::new("qc.verdict", what));
        if let Some(why) = error {
            span.set_status(Status::error(why.into_owned()));
        }
        span.end();
    }

    /// Ends a settle's span; `failed` when it did not happen as asked (a dead-letter send that
    /// failed, a delete SQS never confirmed).
    pub fn end_settle(self, failed: Option<&str>) {
        let span = self.cx.span();
        if !span.is_recording() {
            return;
        }
        if let Some(why) = failed {
            span.set_status(Status::error(why.to_string()));
        }
        span.end();
    }
}

/// The span name's part for a fate (also the `qc.outcome` of `qc.message`).
pub fn fate_name(fate: &Fate) -> &'static str {
    match fate {
        Fate::Delete { .. } | Fate::Discard => "delete",
        Fate::RetryAfter { .. } => "retry",
        Fate::Release | Fate::Hold => "release",
        Fate::Hide(_) => "hide",
        Fate::DeadLetter(_) => "dead_letter",
        Fate::Leave(_) => "leave",
        Fate::Abandon => "abandon",
    }
}

/// The trace of a message without a producer's context: from its id, so every delivery of the
/// message is in one trace (and sampled alike).
pub fn message_trace_id(message_id: &str) -> TraceId {
    use sha2::Digest as _;
    let digest = sha2::Sha256::new()
        .chain_update(b"qc-message:")
        .chain_update(message_id.as_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    TraceId::from_bytes(id)
}

/// The producer's context as a remote parent; an empty context when the message carries none.
fn producer_context(t: &TraceContext) -> Context {
    let Some(tp) = &t.traceparent else {
        return Context::new();
    };
    // `worker::trace` validated it: 00-{32 hex}-{16 hex}-{2 hex}.
    let mut parts = tp.split('-').skip(1);
    let (Some(trace), Some(parent), Some(flags)) = (parts.next(), parts.next(), parts.next())
    else {
        return Context::new();
    };
    let (Ok(trace), Ok(parent), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(parent),
        u8::from_str_radix(flags, 16),
    ) else {
        return Context::new();
    };
    let state = t
        .tracestate
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let sc = SpanContext::new(trace, parent, TraceFlags::new(flags & 1), true, state);
    Context::new().with_remote_span_context(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_context_becomes_a_remote_parent() {
        let t = TraceContext::of(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("vendor=abc"),
            None,
        );
        let cx = producer_context(&t);
        let sc = cx.span().span_context().clone();
        assert_eq!(
            sc.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(sc.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert!(sc.is_sampled());
        assert!(sc.is_remote());
        assert_eq!(sc.trace_state().get("vendor"), Some("abc"));
        // The X-Ray header, converted, unsampled.
        let t = TraceContext::of(
            None,
            None,
            Some("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0"),
        );
        let sc = producer_context(&t).span().span_context().clone();
        assert_eq!(
            sc.trace_id(),
            TraceId::from_hex("5759e988bd862e3fe1be46a994272793").unwrap()
        );
        assert!(!sc.is_sampled());
        // None: no parent.
        assert!(
            !producer_context(&TraceContext::default())
                .span()
                .span_context()
                .is_valid()
        );
    }

    #[test]
    fn every_fate_has_a_settle_name() {
        use std::time::Duration;
        let cases = [
            (Fate::Delete { success: true }, "delete"),
            (Fate::Discard, "delete"),
            (
                Fate::RetryAfter {
                    delay: Duration::from_secs(5),
                    wanted: None,
                },
                "retry",
            ),
            (Fate::DeadLetter("bad".into()), "dead_letter"),
            (Fate::Leave(Duration::ZERO), "leave"),
            (Fate::Hide(Duration::ZERO), "hide"),
            (Fate::Release, "release"),
            (Fate::Abandon, "abandon"),
        ];
        for (fate, want) in cases {
            assert_eq!(fate_name(&fate), want, "{fate:?}");
        }
    }
}
