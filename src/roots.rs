//! CA roots of the worker's TLS clients: the AWS SDK's (SQS, STS, over https) and redis's (`rediss://`).
//!
//! The system's roots, as rustls-native-certs finds them (`SSL_CERT_FILE` and `SSL_CERT_DIR` when set,
//! else the platform's standard bundle and directory: what the SDK's client and redis load themselves),
//! are used whenever there are any, so a private CA a user's image trusts keeps working. In the exec
//! layout qc-worker runs in the user's image, which may have none (a `scratch` image holding a static
//! handler). The install step (`--copy-self-to`) therefore writes the operator image's roots beside the
//! copied binary ([`BUNDLE_FILE`]), and a worker that finds no system roots trusts that bundle instead,
//! through the SDK's and redis's own trust-store settings. Nothing is set in the environment: the
//! handler's processes see the user's image as it is.

use std::path::{Path, PathBuf};

use aws_smithy_http_client::tls::{TlsContext, TrustStore};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The bundle's name, in the directory of the qc-worker binary.
pub const BUNDLE_FILE: &str = "ca-certificates.crt";

/// The roots the worker's TLS clients trust.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Roots {
    /// The system's roots (the SDK and redis load them themselves).
    #[default]
    System,
    /// No system roots: the certificates of the bundle beside qc-worker.
    Bundle {
        path: PathBuf,
        /// The bundle's usable certificates, as PEM.
        pem: Vec<u8>,
        count: usize,
    },
    /// No system roots and no bundle: every certificate is refused (https and rediss:// fail).
    Missing,
}

/// A bundle beside qc-worker that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    #[error(
        "cannot read the CA bundle {path} ({reason}); the init container qc-worker-install writes it: \
         check that it ran, or remove the file so that the image's own roots are used"
    )]
    Read { path: String, reason: String },
    #[error(
        "the CA bundle {path} holds no usable CA certificate ({bytes} bytes); the init container \
         qc-worker-install writes it from the operator image's roots: check that it ran, or remove the \
         file so that the image's own roots are used"
    )]
    Empty { path: String, bytes: usize },
    #[error("cannot write the CA bundle {path}: {reason}")]
    Write { path: String, reason: String },
}

impl Roots {
    /// This process's roots: the system's when it has any, else the bundle beside its executable.
    pub fn for_this_process() -> Result<Roots, RootsError> {
        let system = rustls_native_certs::load_native_certs().certs;
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(BUNDLE_FILE)));
        Roots::choose(system.len(), beside.as_deref())
    }

    /// The system's roots when there are any (`system_roots` of them), else the bundle at `bundle`
    /// when it exists: a bundle that exists but is unreadable or holds no certificate is an error.
    pub fn choose(system_roots: usize, bundle: Option<&Path>) -> Result<Roots, RootsError> {
        if system_roots > 0 {
            return Ok(Roots::System);
        }
        let Some(path) = bundle else {
            return Ok(Roots::Missing);
        };
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Roots::Missing),
            Err(e) => {
                return Err(RootsError::Read {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                });
            }
        };
        let certs = anchors(&text);
        if certs.is_empty() {
            return Err(RootsError::Empty {
                path: path.display().to_string(),
                bytes: text.len(),
            });
        }
        Ok(Roots::Bundle {
            path: path.to_path_buf(),
            pem: to_pem(&certs),
            count: certs.len(),
        })
    }

    /// The SDK's TLS settings for these roots.
    pub fn tls_context(&self) -> TlsContext {
        let store = match self {
            Roots::System => TrustStore::default(),
            Roots::Bundle { pem, .. } => TrustStore::empty().with_pem_certificate(pem.clone()),
            // No roots to load: an empty store (the SDK's native loading would find none either,
            // and a debug build asserts that it finds some).
            Roots::Missing => TrustStore::empty(),
        };
        TlsContext::builder()
            .with_trust_store(store)
            .build()
            .unwrap_or_default()
    }

    /// The PEM roots redis should trust instead of the system's (None: the system's).
    pub fn redis_root_cert(&self) -> Option<Vec<u8>> {
        match self {
            Roots::Bundle { pem, .. } => Some(pem.clone()),
            Roots::System | Roots::Missing => None,
        }
    }
}

/// Writes this process's system roots to `to` as a PEM bundle (mode 0644, written beside and renamed
/// so that a half-written bundle is never read); the number of certificates, 0 when there are none
/// (nothing is written then).
pub fn write_system_bundle(to: &Path) -> Result<usize, RootsError> {
    use std::os::unix::fs::PermissionsExt;
    let certs: Vec<CertificateDer<'static>> = rustls_native_certs::load_native_certs()
        .certs
        .into_iter()
        .filter(is_anchor)
        .collect();
    if certs.is_empty() {
        return Ok(0);
    }
    let write_err = |path: &Path, e: std::io::Error| RootsError::Write {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut tmp = to.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, to_pem(&certs)).map_err(|e| write_err(&tmp, e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| write_err(&tmp, e))?;
    std::fs::rename(&tmp, to).map_err(|e| write_err(to, e))?;
    Ok(certs.len())
}

/// The certificates of a PEM text that rustls takes as trust anchors (the SDK's TLS layer panics on
/// one it cannot take, so none of those is passed on). Reading stops at the first malformed block.
fn anchors(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .map_while(Result::ok)
        .filter(is_anchor)
        .collect()
}

fn is_anchor(cert: &CertificateDer<'_>) -> bool {
    rustls::RootCertStore::empty().add(cert.clone()).is_ok()
}

/// Certificates as a PEM bundle.
fn to_pem(certs: &[CertificateDer<'_>]) -> Vec<u8> {
    use base64::Engine as _;
    let mut out = String::new();
    for cert in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed CA made by openssl.
    fn ca(dir: &Path, name: &str) -> Vec<u8> {
        let out = std::process::Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args([
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ])
            .args(["-subj", &format!("/CN={name}")])
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read(dir.join(format!("{name}.crt"))).unwrap()
    }

    #[test]
    fn system_roots_win_over_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join(BUNDLE_FILE);
        std::fs::write(&bundle, ca(dir.path(), "a")).unwrap();
        assert_eq!(Roots::choose(1, Some(&bundle)).unwrap(), Roots::System);
    }

    #[test]
    fn without_system_roots_the_bundle_is_trusted_and_its_junk_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let a = ca(dir.path(), "a");
        let b = ca(dir.path(), "b");
        let bundle = dir.path().join(BUNDLE_FILE);
        // Text between certificates, as Debian's bundle has none but others do.
        let text = [&b"# comment\n"[..], &a, b"\n", &b].concat();
        std::fs::write(&bundle, &text).unwrap();
        let Roots::Bundle { path, pem, count } = Roots::choose(0, Some(&bundle)).unwrap() else {
            panic!("the bundle is not used");
        };
        assert_eq!((path, count), (bundle, 2));
        // The PEM handed on holds the same two certificates.
        let want: Vec<_> = CertificateDer::pem_slice_iter(&text)
            .map(Result::unwrap)
            .collect();
        let got: Vec<_> = CertificateDer::pem_slice_iter(&pem)
            .map(Result::unwrap)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn without_system_roots_or_bundle_nothing_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join(BUNDLE_FILE);
        assert_eq!(Roots::choose(0, Some(&absent)).unwrap(), Roots::Missing);
        assert_eq!(Roots::choose(0, None).unwrap(), Roots::Missing);
    }

    #[test]
    fn a_bundle_without_certificates_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join(BUNDLE_FILE);
        std::fs::write(&bundle, "not a certificate\n").unwrap();
        let e = Roots::choose(0, Some(&bundle)).unwrap_err().to_string();
        assert!(e.contains(&bundle.display().to_string()), "{e}");
        assert!(e.contains("no usable CA certificate"), "{e}");
        assert!(e.contains("qc-worker-install"), "{e}");
        // A directory in its place cannot be read.
        let dir2 = dir.path().join("d");
        std::fs::create_dir(dir2.join("")).unwrap();
        let e = Roots::choose(0, Some(&dir2)).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
    }
}
