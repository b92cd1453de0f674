//! Who may do what: principals, their credentials and their scopes.
//!
//! `serve --auth FILE` reads a TOML file of principals. A principal is
//! known by a bearer token (stored only as its SHA-256, in hex) or by the
//! subject name (CN) of its mTLS client certificate, and holds **scopes**:
//! key prefixes, each with the rights it grants there:
//!
//! | right | RPCs |
//! |---|---|
//! | `hold` | Acquire, Renew, Release, the tool-call writes (and the Session stream's) |
//! | `check` | Check |
//! | `read` | Get, List (only the keys the caller may read), ListToolCalls |
//! | `admin` | every right on the prefix |
//!
//! ```toml
//! [[principal]]
//! name = "fleet-a"
//! token_sha256 = "9f86d0…"          # sha256 of the bearer token, hex
//! bind_owner = true                 # owners must start with "fleet-a"
//! scopes = [{ prefix = "session:", rights = ["hold", "check"] }]
//!
//! [[principal]]
//! name = "dashboard"
//! subject = "dashboard.internal"    # CN of an mTLS client certificate
//! scopes = [{ prefix = "", rights = ["read"] }]
//! ```
//!
//! A missing or unknown credential is UNAUTHENTICATED; a known one outside
//! its scope is PERMISSION_DENIED naming the principal, the right and the
//! key, never the token.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use leasehold_core::error::Error;

/// What a scope allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Right {
    Hold,
    Check,
    Read,
    Admin,
}

impl Right {
    pub fn name(self) -> &'static str {
        match self {
            Right::Hold => "hold",
            Right::Check => "check",
            Right::Read => "read",
            Right::Admin => "admin",
        }
    }
}

/// A key prefix and the rights granted on keys that start with it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    pub prefix: String,
    pub rights: Vec<Right>,
}

/// One principal of the auth file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    pub name: String,
    /// The SHA-256 of the principal's bearer token, in hex.
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// The subject (CN) of the principal's mTLS client certificate.
    #[serde(default)]
    pub subject: Option<String>,
    /// Whether the `owner` of its Acquires must start with `name`, so one
    /// tenant cannot pose as another's owner.
    #[serde(default)]
    pub bind_owner: bool,
    #[serde(default)]
    pub scopes: Vec<Scope>,
}

impl Principal {
    /// Whether the principal holds `right` on `key`.
    pub fn can(&self, right: Right, key: &str) -> bool {
        self.scopes.iter().any(|scope| {
            key.starts_with(&scope.prefix)
                && scope
                    .rights
                    .iter()
                    .any(|r| *r == right || *r == Right::Admin)
        })
    }

    /// `Ok` when the principal holds `right` on `key`.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] naming the principal, the right and the key.
    pub fn allow(&self, right: Right, key: &str) -> Result<(), Error> {
        if self.can(right, key) {
            return Ok(());
        }
        Err(Error::NotAllowed {
            principal: self.name.clone(),
            right: right.name().to_owned(),
            key: key.to_owned(),
        })
    }

    /// `Ok` when the principal may name `owner` as a holder.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] when its owners are bound to its name and
    /// `owner` does not start with it.
    pub fn allow_owner(&self, owner: &str) -> Result<(), Error> {
        if !self.bind_owner || owner.starts_with(&self.name) {
            return Ok(());
        }
        Err(Error::NotAllowed {
            principal: self.name.clone(),
            right: format!("owner {owner:?} (owners must start with {:?})", self.name),
            key: String::new(),
        })
    }
}

/// The principals of an auth file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default, rename = "principal")]
    pub principals: Vec<Principal>,
}

/// An auth file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("auth file {path}: {reason}")]
pub struct AuthError {
    path: String,
    reason: String,
}

impl AuthConfig {
    /// Reads and checks the auth file at `path`.
    ///
    /// # Errors
    /// [`AuthError`] when it cannot be read or parsed, or a principal has
    /// no credential, a malformed hash, or a name used twice.
    pub fn load(path: &Path) -> Result<AuthConfig, AuthError> {
        let err = |reason: String| AuthError {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Self::parse(&text).map_err(err)
    }

    /// Parses and checks an auth file's text.
    ///
    /// # Errors
    /// A description of the first problem.
    pub fn parse(text: &str) -> Result<AuthConfig, String> {
        let mut config: AuthConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut names = std::collections::HashSet::new();
        for principal in &mut config.principals {
            if !names.insert(principal.name.clone()) {
                return Err(format!("principal {:?} is defined twice", principal.name));
            }
            if principal.token_sha256.is_none() && principal.subject.is_none() {
                return Err(format!(
                    "principal {:?} has neither token_sha256 nor subject",
                    principal.name
                ));
            }
            if let Some(hash) = &mut principal.token_sha256 {
                *hash = hash.to_ascii_lowercase();
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "principal {:?}: token_sha256 must be 64 hex digits (sha256sum of the token)",
                        principal.name
                    ));
                }
            }
        }
        Ok(config)
    }

    /// The principal presenting `token` (a bearer token) or, failing that,
    /// the client certificate whose subject is `subject`.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] when neither is known.
    pub fn authenticate(
        &self,
        token: Option<&str>,
        subject: Option<&str>,
    ) -> Result<&Principal, Error> {
        self.position(token, subject).map(|i| &self.principals[i])
    }

    /// As [`AuthConfig::authenticate`], the principal's place in the file.
    fn position(&self, token: Option<&str>, subject: Option<&str>) -> Result<usize, Error> {
        if let Some(token) = token {
            let hash = sha256_hex(token.as_bytes());
            return self
                .principals
                .iter()
                .position(|p| {
                    p.token_sha256
                        .as_deref()
                        .is_some_and(|h| constant_time_eq(h.as_bytes(), hash.as_bytes()))
                })
                .ok_or_else(|| Error::Unauthenticated("unknown bearer token".into()));
        }
        if let Some(subject) = subject {
            return self
                .principals
                .iter()
                .position(|p| p.subject.as_deref() == Some(subject))
                .ok_or_else(|| {
                    Error::Unauthenticated(format!(
                        "no principal for client certificate {subject:?}"
                    ))
                });
        }
        Err(Error::Unauthenticated(
            "no credential: send `authorization: Bearer <token>` or a client certificate".into(),
        ))
    }
}

/// An authenticated caller: a principal of a loaded auth file, cheap to
/// clone (it shares the file) and to keep for a whole Session stream.
#[derive(Debug, Clone)]
pub struct Caller {
    auth: Arc<AuthConfig>,
    index: usize,
}

impl Caller {
    /// The caller presenting `token` or the client certificate `subject`.
    ///
    /// # Errors
    /// As [`AuthConfig::authenticate`].
    pub fn authenticate(
        auth: &Arc<AuthConfig>,
        token: Option<&str>,
        subject: Option<&str>,
    ) -> Result<Caller, Error> {
        let index = auth.position(token, subject)?;
        Ok(Caller {
            auth: auth.clone(),
            index,
        })
    }
}

impl std::ops::Deref for Caller {
    type Target = Principal;

    fn deref(&self) -> &Principal {
        &self.auth.principals[self.index]
    }
}

/// The SHA-256 of `bytes`, in lowercase hex (what `sha256sum` prints).
pub fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut hex = String::with_capacity(64);
    for b in digest.as_ref() {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    hex
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The subject common name of a DER client certificate.
pub fn subject_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [[principal]]
        name = "fleet-a"
        token_sha256 = "TOKEN_HASH"
        bind_owner = true
        scopes = [{ prefix = "session:", rights = ["hold", "check"] }]

        [[principal]]
        name = "dashboard"
        subject = "dashboard.internal"
        scopes = [{ prefix = "", rights = ["read"] }]
    "#;

    fn config() -> AuthConfig {
        AuthConfig::parse(&FILE.replace("TOKEN_HASH", &sha256_hex(b"s3cret"))).unwrap()
    }

    #[test]
    fn tokens_and_subjects_authenticate_and_scopes_decide() {
        let config = config();
        let fleet = config.authenticate(Some("s3cret"), None).unwrap();
        assert_eq!(fleet.name, "fleet-a");
        assert!(fleet.can(Right::Hold, "session:1"));
        assert!(fleet.can(Right::Check, "session:1"));
        assert!(!fleet.can(Right::Read, "session:1"));
        assert!(!fleet.can(Right::Hold, "db:1"));
        assert!(fleet.allow_owner("fleet-a:host:1").is_ok());
        assert!(fleet.allow_owner("fleet-b:host:1").is_err());
        let dash = config
            .authenticate(None, Some("dashboard.internal"))
            .unwrap();
        assert!(dash.can(Right::Read, "anything"));
        assert!(!dash.can(Right::Hold, "session:1"));
        assert!(matches!(
            config.authenticate(Some("wrong"), None),
            Err(Error::Unauthenticated(_))
        ));
        assert!(matches!(
            config.authenticate(None, None),
            Err(Error::Unauthenticated(_))
        ));
        let refusal = fleet.allow(Right::Read, "session:1").unwrap_err();
        assert!(!refusal.to_string().contains("s3cret"));
    }

    #[test]
    fn token_hashes_are_what_sha256sum_prints() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(AuthConfig::parse("[[principal]]\nname = \"x\"\n").is_err());
        assert!(
            AuthConfig::parse("[[principal]]\nname = \"x\"\ntoken_sha256 = \"abc\"\n").is_err()
        );
        assert!(
            AuthConfig::parse("[[principal]]\nname = \"x\"\nsubject = \"s\"\nextra = 1\n").is_err()
        );
        let twice = "[[principal]]\nname = \"x\"\nsubject = \"a\"\n[[principal]]\nname = \"x\"\nsubject = \"b\"\n";
        assert!(AuthConfig::parse(twice).is_err());
    }
}
