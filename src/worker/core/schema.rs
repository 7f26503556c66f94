//! `handler.schema`: a message body checked against a JSON Schema before any handler call. Pure: the
//! worker reads the schema's file and hands its text here; a body that fails is poison with a reason.

/// Why a schema cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the schema is not JSON: {0} (handler.schema names a ConfigMap key that must hold a JSON Schema document)"
    )]
    ParseSchema(String),
    #[error(
        "the schema does not compile: {0} (remote $refs are never fetched: bundle them into the document)"
    )]
    CompileSchema(String),
}

/// A compiled JSON Schema.
pub struct Schema {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schema")
    }
}

impl Schema {
    /// Compiles `text` (a JSON Schema; draft 2020-12 unless its `$schema` names another). The
    /// crate is built without its resolvers: a `$ref` outside the document is an error, never a fetch.
    pub fn compile(text: &str) -> Result<Schema, SchemaError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| SchemaError::ParseSchema(e.to_string()))?;
        let validator = jsonschema::validator_for(&value)
            .map_err(|e| SchemaError::CompileSchema(e.to_string()))?;
        Ok(Schema { validator })
    }

    /// None when `body` is JSON that validates; else the reason it is poison: the body is not JSON,
    /// or the first validation error with where in the body it is (a JSON pointer, `/` the whole body).
    pub fn violation(&self, body: &[u8]) -> Option<String> {
        let value: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return Some(format!(
                    "body is not JSON, so handler.schema cannot match it: {e}"
                ));
            }
        };
        match self.validator.validate(&value) {
            Ok(()) => None,
            Err(e) => {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_string() } else { at };
                Some(format!("body does not match handler.schema at {at}: {e}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{
        "type": "object",
        "required": ["orderId", "amount"],
        "properties": {
            "orderId": {"type": "string", "minLength": 1},
            "amount": {"type": "number", "minimum": 0},
            "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}}
        }
    }"#;

    #[test]
    fn valid_bodies_pass_and_each_violation_names_where_and_what() {
        let s = Schema::compile(ORDER).unwrap();
        assert_eq!(s.violation(br#"{"orderId":"o-1","amount":3}"#), None);
        let cases: [(&[u8], &[&str]); 6] = [
            (br#"{"amount":3}"#, &["at /:", "orderId"]),
            (
                br#"{"orderId":"o-1","amount":-1}"#,
                &["at /amount:", "minimum"],
            ),
            (br#"{"orderId":7,"amount":1}"#, &["at /orderId:", "string"]),
            (
                br#"{"orderId":"o","amount":1,"lines":[{"sku":"a"},{}]}"#,
                &["at /lines/1:", "sku"],
            ),
            (b"not json", &["not JSON"]),
            (b"", &["not JSON"]),
        ];
        for (body, needles) in cases {
            let reason = s
                .violation(body)
                .unwrap_or_else(|| panic!("{} must be poison", String::from_utf8_lossy(body)));
            for n in needles {
                assert!(reason.contains(n), "{reason:?} lacks {n:?}");
            }
        }
    }

    #[test]
    fn a_schema_that_is_not_json_or_does_not_compile_is_refused() {
        assert!(matches!(
            Schema::compile("{type: object"),
            Err(SchemaError::ParseSchema(_))
        ));
        assert!(matches!(
            Schema::compile(r#"{"type": "no-such-type"}"#),
            Err(SchemaError::CompileSchema(_))
        ));
        // Never fetched: a remote reference does not compile.
        assert!(matches!(
            Schema::compile(r#"{"$ref": "https://example.invalid/order.json"}"#),
            Err(SchemaError::CompileSchema(_))
        ));
        // A local reference is fine.
        let s = Schema::compile(
            r##"{"$defs": {"id": {"type": "string"}}, "properties": {"id": {"$ref": "#/$defs/id"}}}"##,
        )
        .unwrap();
        assert!(s.violation(br#"{"id": 1}"#).is_some());
        assert_eq!(s.violation(br#"{"id": "x"}"#), None);
    }
}
