//! Trace context of a message for its handler: a W3C `traceparent` from the message's own `traceparent`
//! attribute (a producer instrumented with OpenTelemetry), else converted from the X-Ray header SQS
//! keeps in the `AWSTraceHeader` system attribute. Pure; a header that cannot be read is dropped (the
//! message is handled without trace context), never an error.
//!
//! X-Ray: `Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1`
//! W3C:   `00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01`
//! The trace id is the root's epoch and unique parts joined (32 hex digits), the parent id is `Parent`
//! (16 hex digits), the flags are `01` for `Sampled=1` and `00` otherwise (`0`, `?` or absent). A root
//! without `Parent` has no span to continue and gives no `traceparent`.

/// The trace context handed to a handler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// W3C `traceparent` (version 00).
    pub traceparent: Option<String>,
    /// W3C `tracestate`, passed on from the message's `tracestate` attribute with its `traceparent`.
    pub tracestate: Option<String>,
    /// The X-Ray header as SQS gave it (`AWSTraceHeader`), for `x-amzn-trace-id` / `_X_AMZN_TRACE_ID`.
    pub xray: Option<String>,
}

impl TraceContext {
    /// From the message's `traceparent` / `tracestate` attributes and its `AWSTraceHeader`: a valid
    /// `traceparent` attribute wins (it is the producer's own context); otherwise the X-Ray header
    /// converted. Anything malformed is left out.
    pub fn of(
        traceparent_attr: Option<&str>,
        tracestate_attr: Option<&str>,
        aws_trace_header: Option<&str>,
    ) -> TraceContext {
        let xray = aws_trace_header
            .map(str::trim)
            .filter(|h| !h.is_empty() && h.len() <= 1024 && is_header_safe(h))
            .map(str::to_string);
        if let Some(tp) = traceparent_attr.and_then(parse_traceparent) {
            let tracestate = tracestate_attr
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.len() <= 512 && is_header_safe(s))
                .map(str::to_string);
            return TraceContext {
                traceparent: Some(tp),
                tracestate,
                xray,
            };
        }
        TraceContext {
            traceparent: xray.as_deref().and_then(xray_to_traceparent),
            tracestate: None,
            xray,
        }
    }
}

impl TraceContext {
    /// The trace context of a received message: its `traceparent` / `tracestate` string attributes
    /// (names matched without regard to case, the first in sorted order) and its `AWSTraceHeader`.
    /// Tracing on, the worker's own `qc.handle` span (`Message::handler_traceparent`) takes the
    /// `traceparent`'s place; the producer's `tracestate` and X-Ray header go along unchanged.
    pub fn of_message(msg: &crate::worker::sqs::Message) -> TraceContext {
        let producer = TraceContext::of_message_attributes(msg);
        match &msg.handler_traceparent {
            Some(tp) => TraceContext {
                traceparent: Some(tp.clone()),
                ..producer
            },
            None => producer,
        }
    }

    /// `of_message` without the worker's own span: what the producer sent.
    pub fn of_message_attributes(msg: &crate::worker::sqs::Message) -> TraceContext {
        let attr = |name: &str| {
            msg.attributes
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.string.as_deref())
        };
        TraceContext::of(
            attr("traceparent"),
            attr("tracestate"),
            msg.trace_header.as_deref(),
        )
    }
}

/// Printable ASCII only: safe to put in a header line or an environment variable as is.
fn is_header_safe(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn all_zero(s: &str) -> bool {
    s.bytes().all(|b| b == b'0')
}

/// A well-formed W3C `traceparent`, normalised (trimmed); None when it is not one. Version `00` must
/// have exactly four fields; a later version may have more (kept as the first four, per the spec's
/// forward-compatibility rule); version `ff` is invalid.
pub fn parse_traceparent(s: &str) -> Option<String> {
    let s = s.trim();
    let mut parts = s.split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    if !is_lower_hex(version, 2) || version == "ff" {
        return None;
    }
    if version == "00" && rest.is_some() {
        return None;
    }
    if !is_lower_hex(trace_id, 32) || all_zero(trace_id) {
        return None;
    }
    if !is_lower_hex(parent_id, 16) || all_zero(parent_id) {
        return None;
    }
    if !is_lower_hex(flags, 2) {
        return None;
    }
    Some(format!("00-{trace_id}-{parent_id}-{flags}"))
}

/// The W3C `traceparent` of an X-Ray trace header, or None when it has no usable `Root` and `Parent`.
pub fn xray_to_traceparent(header: &str) -> Option<String> {
    let mut root = None;
    let mut parent = None;
    let mut sampled = false;
    for field in header.split(';') {
        let Some((k, v)) = field.split_once('=') else {
            continue;
        };
        match k.trim() {
            "Root" => root = Some(v.trim()),
            "Parent" => parent = Some(v.trim()),
            "Sampled" => sampled = v.trim() == "1",
            _ => {}
        }
    }
    let mut r = root?.split('-');
    let (version, epoch, unique) = (r.next()?, r.next()?, r.next()?);
    if r.next().is_some() || version != "1" {
        return None;
    }
    let epoch = epoch.to_ascii_lowercase();
    let unique = unique.to_ascii_lowercase();
    if !is_lower_hex(&epoch, 8) || !is_lower_hex(&unique, 24) {
        return None;
    }
    let trace_id = format!("{epoch}{unique}");
    let parent = parent?.to_ascii_lowercase();
    if all_zero(&trace_id) || !is_lower_hex(&parent, 16) || all_zero(&parent) {
        return None;
    }
    let flags = if sampled { "01" } else { "00" };
    Some(format!("00-{trace_id}-{parent}-{flags}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xray_headers_convert_to_traceparent() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
                Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"),
            ),
            // Not sampled, deferred, or no decision: flags 00.
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0",
                Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"),
            ),
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=?",
                Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"),
            ),
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
                Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"),
            ),
            // Field order, spaces, upper-case hex and extra fields (Lineage, Self) are tolerated.
            (
                "Sampled=1; Parent=53995C3F42CD8AD8 ;Lineage=a87bd80c:1|68fd508a:5;Root=1-5759E988-BD862E3FE1BE46A994272793",
                Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"),
            ),
            // Malformed: dropped.
            ("", None),
            ("garbage", None),
            ("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1", None), // no Parent
            ("Parent=53995c3f42cd8ad8;Sampled=1", None),                  // no Root
            (
                "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
                None,
            ), // unknown version
            (
                "Root=1-5759e98-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
                None,
            ), // short epoch
            (
                "Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8",
                None,
            ), // short unique
            (
                "Root=1-5759e988-bd862e3fe1be46a99427279g;Parent=53995c3f42cd8ad8",
                None,
            ), // not hex
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793-00;Parent=53995c3f42cd8ad8",
                None,
            ), // extra root part
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad",
                None,
            ), // short parent
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",
                None,
            ), // zero parent
            (
                "Root=1-00000000-000000000000000000000000;Parent=53995c3f42cd8ad8",
                None,
            ), // zero trace id
            (
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8\r\nx: y",
                None,
            ), // injection attempt in the parent
        ];
        for (input, want) in cases {
            assert_eq!(
                xray_to_traceparent(input).as_deref(),
                *want,
                "X-Ray header {input:?}"
            );
        }
    }

    #[test]
    fn traceparent_attributes_are_validated() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cases: &[(&str, Option<&str>)] = &[
            (ok, Some(ok)),
            (
                " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
                Some(ok),
            ),
            // A later version with more fields: the first four, as version 00.
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                Some(ok),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                None,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                None,
            ),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                None,
            ),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_traceparent(input).as_deref(), *want, "{input:?}");
        }
    }

    #[test]
    fn a_traceparent_attribute_wins_over_the_xray_header_and_bad_input_is_dropped() {
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::of(Some(tp), Some("vendor=abc"), Some(xray));
        assert_eq!(c.traceparent.as_deref(), Some(tp));
        assert_eq!(c.tracestate.as_deref(), Some("vendor=abc"));
        assert_eq!(c.xray.as_deref(), Some(xray));
        // A malformed attribute falls back to the X-Ray header; its tracestate goes with it.
        let c = TraceContext::of(Some("nonsense"), Some("vendor=abc"), Some(xray));
        assert_eq!(
            c.traceparent.as_deref(),
            Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01")
        );
        assert_eq!(c.tracestate, None);
        // Nothing usable: nothing at all; a header with control characters is not passed on.
        assert_eq!(TraceContext::of(None, None, None), TraceContext::default());
        assert_eq!(
            TraceContext::of(None, None, Some("Root=1\r\nx-evil: 1")),
            TraceContext::default()
        );
    }
}
