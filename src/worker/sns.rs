//! SNS envelopes (#32): a queue subscribed to a topic without raw delivery receives every message
//! wrapped in the SNS notification JSON. `--unwrap-sns` gives the handler what was published: the
//! envelope's `Message` as the body, its `MessageAttributes` as attributes. Pure: a message in, the
//! handler's view of it out. The queue's own message (the envelope) is what a DLQ or a retry sees.

use base64::Engine as _;

use super::sqs::{AttributeValue, Message};
use crate::api::UnwrapSns;

/// The handler's view of `msg`: `Ok(None)` when it is handed over as received, `Ok(Some(..))` the
/// unwrapped notification, `Err(reason)` when it cannot be unwrapped as asked (poison: it never will).
pub fn unwrap(mode: UnwrapSns, msg: &Message) -> Result<Option<Message>, String> {
    if mode == UnwrapSns::Off {
        return Ok(None);
    }
    let envelope = match serde_json::from_slice::<serde_json::Value>(&msg.body) {
        Ok(serde_json::Value::Object(o)) if is_notification(&o) => o,
        // `auto`: only what looks like a notification is unwrapped; anything else is the
        // producer's own message.
        _ if mode == UnwrapSns::Auto => return Ok(None),
        Ok(_) => {
            return Err(
                "not an SNS notification (a JSON object with \"Type\": \"Notification\" and a TopicArn); \
                 with raw message delivery on, set unwrapSns to off"
                    .into(),
            );
        }
        Err(e) => {
            return Err(format!(
                "not an SNS notification: the body is not JSON ({e})"
            ));
        }
    };
    let Some(serde_json::Value::String(body)) = envelope.get("Message") else {
        return Err("SNS notification without a string \"Message\"".into());
    };
    let mut attributes = match envelope.get("MessageAttributes") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Object(a)) => a
            .iter()
            .map(|(name, v)| attribute(name, v).map(|v| (name.clone(), v)))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err("SNS notification whose \"MessageAttributes\" is not an object".into());
        }
    };
    // The queue's own attributes (rare on a subscription) stay where SNS has none of that name.
    for (name, v) in &msg.attributes {
        if !attributes.iter().any(|(n, _)| n == name) {
            attributes.push((name.clone(), v.clone()));
        }
    }
    attributes.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(Message {
        body: bytes::Bytes::from(body.clone().into_bytes()),
        attributes,
        ..msg.clone()
    }))
}

fn is_notification(o: &serde_json::Map<String, serde_json::Value>) -> bool {
    o.get("Type").and_then(serde_json::Value::as_str) == Some("Notification")
        && o.get("TopicArn").is_some_and(serde_json::Value::is_string)
}

/// One SNS message attribute, `{"Type": "String", "Value": "..."}`: String, Number and String.Array
/// as text, Binary decoded from its base64.
fn attribute(name: &str, v: &serde_json::Value) -> Result<AttributeValue, String> {
    let field = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
    let (Some(data_type), Some(value)) = (field("Type"), field("Value")) else {
        return Err(format!(
            "SNS message attribute {name:?} lacks a string Type and Value"
        ));
    };
    if data_type == "Binary" || data_type.starts_with("Binary.") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .map_err(|e| {
                format!("SNS message attribute {name:?}: Binary value is not base64 ({e})")
            })?;
        Ok(AttributeValue {
            data_type: data_type.to_string(),
            string: None,
            binary: Some(bytes),
        })
    } else {
        Ok(AttributeValue {
            data_type: data_type.to_string(),
            string: Some(value.to_string()),
            binary: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(body: &'static str) -> Message {
        Message::test(body.as_bytes())
    }

    const NOTE: &str = r#"{"Type":"Notification","MessageId":"n-1","TopicArn":"arn:aws:sns:us-east-1:123456789012:orders","Message":"{\"orderId\":\"o-7\"}","Timestamp":"2026-12-06T01:00:00.000Z","MessageAttributes":{"tenant":{"Type":"String","Value":"acme"},"qty":{"Type":"Number","Value":"3"},"blob":{"Type":"Binary","Value":"AAEC"}}}"#;

    #[test]
    fn a_notification_becomes_its_message_and_attributes() {
        let m = msg(NOTE);
        for mode in [UnwrapSns::On, UnwrapSns::Auto] {
            let v = unwrap(mode, &m).unwrap().expect("unwrapped");
            assert_eq!(&v.body[..], br#"{"orderId":"o-7"}"#);
            assert_eq!(v.id, m.id);
            assert_eq!(v.receipt_handle, m.receipt_handle);
            let names: Vec<_> = v.attributes.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["blob", "qty", "tenant"]);
            assert_eq!(v.attributes[2].1, AttributeValue::string("acme"));
            assert_eq!(v.attributes[1].1.data_type, "Number");
            assert_eq!(v.attributes[0].1.binary.as_deref(), Some(&[0u8, 1, 2][..]));
        }
        assert!(unwrap(UnwrapSns::Off, &m).unwrap().is_none());
    }

    #[test]
    fn auto_passes_anything_else_through_and_on_refuses_it() {
        for body in [
            r#"{"orderId":"o-1"}"#,
            "plain text",
            r#"{"Type":"Notification"}"#,
        ] {
            assert!(
                unwrap(UnwrapSns::Auto, &msg(body)).unwrap().is_none(),
                "{body}"
            );
            let e = unwrap(UnwrapSns::On, &msg(body)).unwrap_err();
            assert!(e.contains("not an SNS notification"), "{body}: {e}");
        }
    }

    #[test]
    fn a_malformed_notification_is_refused_with_the_reason() {
        let cases = [
            (
                r#"{"Type":"Notification","TopicArn":"t","Message":7}"#,
                "without a string \"Message\"",
            ),
            (
                r#"{"Type":"Notification","TopicArn":"t","Message":"m","MessageAttributes":[1]}"#,
                "is not an object",
            ),
            (
                r#"{"Type":"Notification","TopicArn":"t","Message":"m","MessageAttributes":{"a":{"Type":"String"}}}"#,
                "\"a\" lacks a string Type and Value",
            ),
            (
                r#"{"Type":"Notification","TopicArn":"t","Message":"m","MessageAttributes":{"b":{"Type":"Binary","Value":"!!"}}}"#,
                "not base64",
            ),
        ];
        for (body, needle) in cases {
            for mode in [UnwrapSns::On, UnwrapSns::Auto] {
                let e = unwrap(mode, &msg(body)).unwrap_err();
                assert!(e.contains(needle), "{body}: {e}");
            }
        }
    }

    #[test]
    fn the_queues_own_attributes_stay_unless_sns_names_them() {
        let m = Message {
            attributes: vec![
                ("tenant".into(), AttributeValue::string("from-sqs")),
                ("trace".into(), AttributeValue::string("t-1")),
            ],
            ..msg(NOTE)
        };
        let v = unwrap(UnwrapSns::Auto, &m).unwrap().unwrap();
        let get = |n: &str| {
            v.attributes
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, a)| a.string.clone())
        };
        assert_eq!(get("tenant"), Some(Some("acme".into())));
        assert_eq!(get("trace"), Some(Some("t-1".into())));
    }
}
