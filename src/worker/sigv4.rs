//! AWS Signature Version 4 for the worker's SQS requests: a POST with a JSON body and a handful of
//! headers. The signing key is derived once per day, region and secret, not on every call; the
//! result is checked against `aws-sigv4` (the SDK's signer) in the tests.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::SystemTime;

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

type Hmac = hmac::Hmac<Sha256>;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The headers of one signed request, to be sent as they are.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed {
    pub amz_date: String,
    pub authorization: String,
}

/// The key for one day, region, service and secret.
struct DayKey {
    date: String,
    secret: String,
    key: [u8; 32],
}

pub struct Signer {
    region: String,
    service: &'static str,
    /// The canonical URI of every request (the endpoint's path, encoded as SigV4 asks).
    canonical_uri: String,
    key: Mutex<Option<DayKey>>,
}

impl Signer {
    pub fn new(region: &str, service: &'static str, path: &str) -> Signer {
        Signer {
            region: region.to_string(),
            service,
            canonical_uri: canonical_uri(path),
            key: Mutex::new(None),
        }
    }

    /// Signs a POST of `body` carrying `headers` (lowercase names, sorted, without `x-amz-date`
    /// and the session token, which are added here). Every header given is signed.
    pub fn sign(
        &self,
        access_key: &str,
        secret: &str,
        session_token: Option<&str>,
        headers: &[(&str, &str)],
        body: &[u8],
        now: SystemTime,
    ) -> Result<Signed, String> {
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let amz_date = amz_date(secs);
        let date = &amz_date[..8];

        let mut all: Vec<(&str, &str)> = Vec::with_capacity(headers.len() + 2);
        all.extend_from_slice(headers);
        all.push(("x-amz-date", &amz_date));
        if let Some(t) = session_token {
            all.push(("x-amz-security-token", t));
        }
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));

        let mut signed_headers = String::with_capacity(96);
        let mut canonical = String::with_capacity(512);
        canonical.push_str("POST\n");
        canonical.push_str(&self.canonical_uri);
        canonical.push_str("\n\n");
        for (i, (name, value)) in all.iter().enumerate() {
            canonical.push_str(name);
            canonical.push(':');
            push_trimmed(&mut canonical, value);
            canonical.push('\n');
            if i > 0 {
                signed_headers.push(';');
            }
            signed_headers.push_str(name);
        }
        canonical.push('\n');
        canonical.push_str(&signed_headers);
        canonical.push('\n');
        push_hex(&mut canonical, &Sha256::digest(body));

        let scope = format!("{date}/{}/{}/aws4_request", self.region, self.service);
        let mut to_sign = String::with_capacity(160);
        let _ = write!(to_sign, "{ALGORITHM}\n{amz_date}\n{scope}\n");
        push_hex(&mut to_sign, &Sha256::digest(canonical.as_bytes()));

        let key = self.day_key(date, secret)?;
        let mut authorization = String::with_capacity(256);
        let _ = write!(
            authorization,
            "{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed_headers}, Signature="
        );
        push_hex(&mut authorization, &hmac(&key, to_sign.as_bytes())?);
        Ok(Signed {
            amz_date,
            authorization,
        })
    }

    fn day_key(&self, date: &str, secret: &str) -> Result<[u8; 32], String> {
        if let Ok(cached) = self.key.lock()
            && let Some(k) = cached.as_ref()
            && k.date == date
            && k.secret == secret
        {
            return Ok(k.key);
        }
        let mut secret_key = String::with_capacity(4 + secret.len());
        secret_key.push_str("AWS4");
        secret_key.push_str(secret);
        let k = hmac(secret_key.as_bytes(), date.as_bytes())?;
        let k = hmac(&k, self.region.as_bytes())?;
        let k = hmac(&k, self.service.as_bytes())?;
        let key = hmac(&k, b"aws4_request")?;
        if let Ok(mut cached) = self.key.lock() {
            *cached = Some(DayKey {
                date: date.to_string(),
                secret: secret.to_string(),
                key,
            });
        }
        Ok(key)
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Result<[u8; 32], String> {
    let mut m = <Hmac as KeyInit>::new_from_slice(key).map_err(|e| format!("HMAC key: {e}"))?;
    m.update(data);
    Ok(m.finalize().into_bytes().into())
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
}

/// A header value as SigV4 canonicalizes it: trimmed, inner runs of spaces collapsed to one.
fn push_trimmed(out: &mut String, value: &str) {
    let mut space = false;
    for c in value.trim().chars() {
        if c == ' ' {
            space = true;
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time.
fn amz_date(secs: u64) -> String {
    let (y, m, d) = super::handler::civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The path with dot segments removed, then percent-encoded once more (SigV4's double encoding for
/// every service but S3): unreserved characters and `/` stay, everything else becomes `%XX`.
fn canonical_uri(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for seg in path.split('/').skip(1) {
        match seg {
            "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut normalized = String::from("/");
    normalized.push_str(&segments.join("/"));
    if path.ends_with("/.") || path.ends_with("/..") {
        // A trailing dot segment leaves the directory: the slash stays.
        if !normalized.ends_with('/') {
            normalized.push('/');
        }
    }
    let mut out = String::with_capacity(normalized.len());
    for b in normalized.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::Credentials;
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;
    use std::time::Duration;

    /// What aws-sigv4 (the SDK's signer) makes of the same request: (x-amz-date, authorization).
    fn sdk_signature(
        url: &str,
        region: &str,
        creds: &Credentials,
        headers: &[(&str, &str)],
        body: &[u8],
        now: SystemTime,
    ) -> (String, String) {
        let identity = creds.clone().into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name("sqs")
            .time(now)
            .settings(SigningSettings::default())
            .build()
            .unwrap()
            .into();
        let signable = SignableRequest::new(
            "POST",
            url,
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .unwrap();
        let (instructions, _) = sign(signable, &params).unwrap().into_parts();
        let (headers, _) = instructions.into_parts();
        let get = |n: &str| {
            headers
                .iter()
                .find(|h| h.name() == n)
                .map(|h| h.value().to_string())
                .unwrap()
        };
        (get("x-amz-date"), get("authorization"))
    }

    #[test]
    fn signatures_match_the_sdk_signer() {
        // (endpoint, region, session token, body, Unix time)
        type Case<'a> = (&'a str, &'a str, Option<&'a str>, &'a [u8], u64);
        let cases: [Case; 5] = [
            (
                "https://sqs.eu-west-1.amazonaws.com",
                "eu-west-1",
                None,
                br#"{"QueueUrl":"u","Entries":[]}"#,
                1_700_000_000,
            ),
            (
                "https://sqs.us-east-1.amazonaws.com/",
                "us-east-1",
                Some("token/+=="),
                b"{}",
                951_782_400,
            ),
            (
                "http://127.0.0.1:4566/",
                "us-east-1",
                None,
                b"",
                1_767_225_599,
            ),
            (
                "http://localhost:4566/prefix/a%20b/./c/../sqs",
                "ap-south-2",
                Some("t"),
                b"{\"x\": \"\xc3\xa9\"}",
                1_800_000_123,
            ),
            (
                "http://[::1]:9324/~user-1_x.y",
                "eu-central-1",
                None,
                &[0, 255, 10],
                4_102_444_800,
            ),
        ];
        for (url, region, token, body, secs) in cases {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
            let creds = Credentials::new(
                "AKIDEXAMPLE",
                "wJalr/K7MDENG+bPxRfi",
                token.map(str::to_string),
                None,
                "t",
            );
            let uri: hyper::Uri = url.parse().unwrap();
            let host = uri.authority().unwrap().as_str().to_string();
            let headers = [
                ("content-type", "application/x-amz-json-1.0"),
                ("host", host.as_str()),
                ("x-amz-target", "AmazonSQS.ReceiveMessage"),
            ];
            let signer = Signer::new(region, "sqs", uri.path());
            // Twice: the second signature comes from the cached day key.
            for _ in 0..2 {
                let ours = signer
                    .sign(
                        "AKIDEXAMPLE",
                        "wJalr/K7MDENG+bPxRfi",
                        token,
                        &headers,
                        body,
                        now,
                    )
                    .unwrap();
                let sdk = sdk_signature(url, region, &creds, &headers, body, now);
                assert_eq!((ours.amz_date, ours.authorization), sdk, "{url}");
            }
        }
    }

    #[test]
    fn the_day_key_follows_the_date_and_the_secret() {
        let signer = Signer::new("us-east-1", "sqs", "/");
        let headers = [("host", "h")];
        let day = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let a = signer.sign("A", "s1", None, &headers, b"", day).unwrap();
        let b = signer.sign("A", "s2", None, &headers, b"", day).unwrap();
        let next_day = day + Duration::from_secs(86_400);
        let c = signer
            .sign("A", "s2", None, &headers, b"", next_day)
            .unwrap();
        let fresh = Signer::new("us-east-1", "sqs", "/")
            .sign("A", "s2", None, &headers, b"", next_day)
            .unwrap();
        assert_ne!(a.authorization, b.authorization);
        assert_eq!(c, fresh);
    }

    #[test]
    fn canonical_uris() {
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("/"), "/");
        assert_eq!(canonical_uri("/a/./b/../c/"), "/a/c/");
        assert_eq!(canonical_uri("/a%20b"), "/a%2520b");
    }
}
