//! Signed bundles: Ed25519 keys, `signature.json`, and the check `--trusted-key` runs.
//!
//! # Keys
//!
//! Ed25519 ([RFC 8032], `ed25519-dalek`). The private key file is PKCS#8 PEM, `-----BEGIN
//! PRIVATE KEY-----` ([RFC 8410] section 7: the 32-byte seed; version 1, or version 2 with the
//! public key, whose agreement with the seed is checked); the public key file is a
//! SubjectPublicKeyInfo PEM, `-----BEGIN PUBLIC KEY-----`. Both are what `openssl genpkey
//! -algorithm ed25519` and `openssl pkey -pubout` write and read. A key's id is the lowercase
//! hex SHA256 of its DER SubjectPublicKeyInfo (44 bytes; `openssl pkey -pubin -in KEY.pub
//! -outform DER | sha256sum`). [`write_key_pair`] writes `KEY` with mode 0600 and `KEY.pub`
//! with 0644, both staged beside `KEY` and linked into place only when both are complete;
//! [`read_signing_key`] refuses a private key file that group or others may access (any of
//! the mode bits 0o077, as OpenSSH refuses an unprotected key).
//!
//! # `signature.json`
//!
//! A DSSE envelope ([DSSE] v1, its JSON form) whose payload is an in-toto Statement v1:
//!
//! ```text
//! {"payloadType": "application/vnd.in-toto+json",
//!  "payload": base64(statement),
//!  "signatures": [{"keyid": KEY ID, "sig": base64(Ed25519(PAE(payloadType, statement)))}]}
//!
//! statement = {"_type": "https://in-toto.io/Statement/v1",
//!   "subject": [{"name": "bundle", "digest": {"sha256": bundle_digest}},
//!               {"name": "manifest.json", "digest": {"sha256": manifest_digest}}],
//!   "predicateType": "urn:lowbit:bundle-signature:v1",
//!   "predicate": {"format_version": 3, "files": [{"path", "size", "sha256" or "tensors_sha256"} per listed file]}}
//!
//! PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body   (lengths in decimal)
//! ```
//!
//! The two digests are the manifest's ([`super::manifest`]: `manifest_digest` covers the whole
//! manifest, which lists every file's SHA256); the file list is there so that a file changed
//! after signing can be named even when the manifest was rewritten to match it. The file is
//! in the bundle directory but not in the manifest's `files`, and no digest covers it, so a
//! bundle is signed after it is written without changing it. Only bundles of format version 2
//! or later can be signed (a version-1 manifest is covered by nothing).
//!
//! # The check
//!
//! [`check_signature`] (`verify --trusted-key`, and `run`/`bench`/`validate --trusted-key`
//! through [`super::reader::Bundle::open_trusted`]) refuses, naming why: a version-1 bundle; no
//! `signature.json`; one that is not a DSSE envelope of this form (one signature, an in-toto
//! payload); a signature no trusted key verifies (Ed25519 `verify_strict`), telling apart a
//! key id that is not trusted from a trusted key's signature that does not verify; and a
//! bundle whose digests are not the signed ones, naming each file whose SHA256 differs from
//! the signed list, or the manifest. Files on disk are checked against the manifest by the
//! integrity check, so together every byte of the bundle but the signature is covered.
//!
//! [RFC 8032]: https://www.rfc-editor.org/rfc/rfc8032
//! [RFC 8410]: https://www.rfc-editor.org/rfc/rfc8410
//! [DSSE]: https://github.com/secure-systems-lab/dsse/blob/v1.0.0/protocol.md

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64ct::{Base64, Encoding as _};
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::manifest::{Digests, FileEntry, Manifest, FORMAT_VERSION, SIGNATURE_FILE};
use super::reader::Bundle;
use super::BundleError;
use crate::util::{self, OutputError};

/// DSSE `payloadType` of the envelope: an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// in-toto Statement v1 `_type`.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The statement's `predicateType`.
pub const PREDICATE_TYPE: &str = "urn:lowbit:bundle-signature:v1";
/// Subject name of the bundle digest in the statement.
pub const SUBJECT_BUNDLE: &str = "bundle";
/// `MAX_KEY_FILE_BYTES`: key files larger than this are refused before parsing (an Ed25519
/// PKCS#8 PEM is 119 bytes, 168 with its public key; a public key PEM 113).
pub const MAX_KEY_FILE_BYTES: u64 = 16 << 10;
/// `MAX_SIGNATURE_BYTES`: `signature.json` larger than this is refused before parsing. It
/// lists every file's path, size and SHA256 (about 150 bytes each, base64 adds a third), less
/// than the manifest, which may be up to [`super::reader::MAX_MANIFEST_BYTES`].
pub const MAX_SIGNATURE_BYTES: u64 = super::reader::MAX_MANIFEST_BYTES;

/// Errors of key files, signing and keygen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// A key file that is not what it should be: not PEM, the wrong kind of key, a key that
    /// is not Ed25519, encrypted, or too large.
    #[error("{path}: {detail}")]
    KeyFile { path: PathBuf, detail: String },
    /// A private key file that group or others may read or write.
    #[error("{path}: private key file has mode {mode:04o}, which lets group or others access it; refused (chmod 600 it)")]
    KeyPermissions { path: PathBuf, mode: u32 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// keygen: an output that exists, or cannot be published.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The operating system's random number generator failed.
    #[error("random key generation: {0}")]
    Random(String),
    /// The bundle to sign cannot be opened or does not verify.
    #[error(transparent)]
    Bundle(#[from] BundleError),
}

impl SignError {
    /// Exit code for the command line: a bundle's failed check is 1, the rest 2.
    pub fn exit_code(&self) -> u8 {
        match self {
            SignError::Bundle(e) => e.exit_code(),
            _ => 2,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SignError + '_ {
    move |source| SignError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A public key a bundle's signature may be checked against (`--trusted-key`).
#[derive(Clone, Debug)]
pub struct PublicKey {
    pub key: VerifyingKey,
    /// [`key_id`] of `key`.
    pub id: String,
    /// The file it was read from (for messages).
    pub path: PathBuf,
}

/// A key's id: lowercase hex SHA256 of its DER SubjectPublicKeyInfo.
pub fn key_id(key: &VerifyingKey) -> String {
    let der = key
        .to_public_key_der()
        .expect("an Ed25519 SubjectPublicKeyInfo encodes");
    util::sha256_hex(der.as_bytes())
}

/// A new key from the operating system's random number generator.
pub fn generate_key() -> Result<SigningKey, SignError> {
    use rand::TryRngCore;
    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    rand::rngs::OsRng
        .try_fill_bytes(seed.as_mut())
        .map_err(|e| SignError::Random(e.to_string()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// `KEY.pub` for `KEY`.
pub fn public_key_path(key_path: &Path) -> PathBuf {
    let mut s = key_path.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

/// The private key as a PKCS#8 v1 PEM document (RFC 8410 section 7, as OpenSSL writes it).
fn private_pem(key: &SigningKey) -> zeroize::Zeroizing<String> {
    let bytes = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    bytes
        .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .expect("an Ed25519 PKCS#8 document encodes")
}

/// The public key as a SubjectPublicKeyInfo PEM document.
pub fn public_pem(key: &VerifyingKey) -> String {
    key.to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .expect("an Ed25519 SubjectPublicKeyInfo encodes")
}

/// Writes `key` to `path` (PKCS#8 PEM, mode 0600) and its public key to `path.pub`
/// (SubjectPublicKeyInfo PEM, mode 0644). Never half-written: both are written in a staging
/// directory beside `path` (mode 0700) and hard-linked into place only when complete, and
/// neither path may exist (a link never replaces a file; if the second link fails, the first
/// is removed). Returns both paths.
pub fn write_key_pair(key: &SigningKey, path: &Path) -> Result<(PathBuf, PathBuf), SignError> {
    let pub_path = public_key_path(path);
    util::refuse_existing(path)?;
    util::refuse_existing(&pub_path)?;
    let staging = util::StagingDir::beside(path)?;
    let (staged_key, staged_pub) = (staging.path().join("key"), staging.path().join("key.pub"));
    write_new_file(&staged_key, private_pem(key).as_bytes(), 0o600)?;
    write_new_file(
        &staged_pub,
        public_pem(&key.verifying_key()).as_bytes(),
        0o644,
    )?;
    let exists_or_io = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                SignError::Output(OutputError::Exists(p))
            } else {
                SignError::Io { path: p, source: e }
            }
        }
    };
    staging.publish(|| -> Result<(), SignError> {
        std::fs::hard_link(&staged_key, path).map_err(exists_or_io(path))?;
        if let Err(e) = std::fs::hard_link(&staged_pub, &pub_path) {
            let _ = std::fs::remove_file(path);
            return Err(exists_or_io(&pub_path)(e));
        }
        Ok(())
    })?;
    Ok((path.to_path_buf(), pub_path))
}

/// Creates `path` (which must not exist) with `mode` on Unix, writes `bytes` and syncs it.
fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), SignError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = o.open(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// Opens a key file: a regular file (a directory or FIFO is refused at open), with its
/// metadata from the open file.
fn open_key(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), SignError> {
    let f = util::open_input(path).map_err(io(path))?;
    let meta = f.metadata().map_err(io(path))?;
    Ok((f, meta))
}

/// Reads an opened key file: at most [`MAX_KEY_FILE_BYTES`], UTF-8.
fn read_key_text(path: &Path, f: std::fs::File) -> Result<String, SignError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    f.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(SignError::KeyFile {
            path: path.to_path_buf(),
            detail: format!("larger than the limit of {MAX_KEY_FILE_BYTES} bytes for a key file"),
        });
    }
    String::from_utf8(bytes).map_err(|e| SignError::KeyFile {
        path: path.to_path_buf(),
        detail: format!(
            "not a PEM text file (byte {} is not UTF-8)",
            e.utf8_error().valid_up_to()
        ),
    })
}

/// The PEM label of the first `-----BEGIN ...-----` line, if any.
fn pem_label(text: &str) -> Option<&str> {
    let start = text.find("-----BEGIN ")? + "-----BEGIN ".len();
    let rest = &text[start..];
    Some(&rest[..rest.find("-----")?])
}

/// Reads a private key file (PKCS#8 PEM, Ed25519). Refuses a file that group or others may
/// access (Unix mode bits 0o077), before reading it.
pub fn read_signing_key(path: &Path) -> Result<SigningKey, SignError> {
    let (f, meta) = open_key(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(SignError::KeyPermissions {
                path: path.to_path_buf(),
                mode: mode & 0o7777,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let text = zeroize::Zeroizing::new(read_key_text(path, f)?);
    let bad = |detail: String| SignError::KeyFile {
        path: path.to_path_buf(),
        detail,
    };
    match pem_label(&text) {
        Some("PRIVATE KEY") => {}
        Some("PUBLIC KEY") => {
            return Err(bad(
                "is a public key (-----BEGIN PUBLIC KEY-----); signing needs the private key (KEY, not KEY.pub)".into(),
            ))
        }
        Some("ENCRYPTED PRIVATE KEY") => {
            return Err(bad(
                "is an encrypted PKCS#8 key; lowbit reads unencrypted keys only (protect the file with its mode instead)".into(),
            ))
        }
        Some(other) => {
            return Err(bad(format!(
                "PEM label {other:?}: expected an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----)"
            )))
        }
        None => {
            return Err(bad(
                "not PEM: expected an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----)".into(),
            ))
        }
    }
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        bad(format!(
            "not an Ed25519 private key in PKCS#8 PEM: {e}{}",
            if matches!(e, ed25519_dalek::pkcs8::Error::KeyMalformed(_)) {
                " (for a version-2 document, the public key must be the seed's)"
            } else {
                ""
            }
        ))
    })
}

/// Reads a public key file (SubjectPublicKeyInfo PEM, Ed25519).
pub fn read_public_key(path: &Path) -> Result<PublicKey, SignError> {
    let (f, _) = open_key(path)?;
    let text = read_key_text(path, f)?;
    let bad = |detail: String| SignError::KeyFile {
        path: path.to_path_buf(),
        detail,
    };
    match pem_label(&text) {
        Some("PUBLIC KEY") => {}
        Some("PRIVATE KEY" | "ENCRYPTED PRIVATE KEY") => {
            return Err(bad(
                "is a private key; --trusted-key takes the public key (KEY.pub)".into(),
            ))
        }
        Some(other) => {
            return Err(bad(format!(
                "PEM label {other:?}: expected an Ed25519 public key in SubjectPublicKeyInfo PEM (-----BEGIN PUBLIC KEY-----)"
            )))
        }
        None => {
            return Err(bad(
                "not PEM: expected an Ed25519 public key in SubjectPublicKeyInfo PEM (-----BEGIN PUBLIC KEY-----)".into(),
            ))
        }
    }
    let key = VerifyingKey::from_public_key_pem(&text).map_err(|e| {
        bad(format!(
            "not an Ed25519 public key in SubjectPublicKeyInfo PEM: {e}"
        ))
    })?;
    Ok(PublicKey {
        id: key_id(&key),
        key,
        path: path.to_path_buf(),
    })
}

/// DSSE's pre-authentication encoding: the bytes the signature is over.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    v.extend_from_slice(payload);
    v
}

/// The DSSE envelope (`signature.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Standard base64 (with padding) of the statement's bytes.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSignature {
    /// [`key_id`] of the signing key (a hint: every trusted key is tried).
    pub keyid: String,
    /// Standard base64 of the 64-byte Ed25519 signature over [`pae`].
    pub sig: String,
}

/// The in-toto statement a bundle signature is over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    pub format_version: u32,
    /// Every file of the manifest's `files`, sorted by path.
    pub files: Vec<FileEntry>,
}

impl Statement {
    /// The statement for a bundle with this manifest and these digests.
    pub fn for_bundle(m: &Manifest, d: &Digests) -> Statement {
        let subject = |name: &str, sha: &str| Subject {
            name: name.into(),
            digest: BTreeMap::from([("sha256".to_string(), sha.to_string())]),
        };
        let mut files = m.files.clone();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Statement {
            type_: STATEMENT_TYPE.into(),
            subject: vec![
                subject(SUBJECT_BUNDLE, &d.bundle_digest),
                subject(super::manifest::MANIFEST_FILE, &d.manifest_digest),
            ],
            predicate_type: PREDICATE_TYPE.into(),
            predicate: Predicate {
                format_version: m.format_version,
                files,
            },
        }
    }

    /// The SHA256 the statement gives the subject `name`.
    fn digest_of(&self, name: &str) -> Option<&str> {
        self.subject
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.digest.get("sha256"))
            .map(String::as_str)
    }
}

/// What `convert sign` did.
#[derive(Clone, Debug)]
pub struct SignSummary {
    pub signature: PathBuf,
    pub key_id: String,
    pub bundle_digest: String,
    pub manifest_digest: String,
    pub files: usize,
    /// An earlier signature was replaced.
    pub replaced: bool,
}

/// Signs the bundle at `dir` with `key`: opens it (every file and both digests checked; a
/// version-1 bundle is refused), then writes `signature.json` over both digests and the file
/// list, replacing an earlier signature. The file is staged beside the bundle and renamed into
/// it, so a reader sees the old signature or the new one, never a part.
pub fn sign_bundle(dir: &Path, key: &SigningKey) -> Result<SignSummary, SignError> {
    let bundle = Bundle::open(dir)?;
    let Some(digests) = bundle.digests.clone() else {
        return Err(BundleError::Manifest {
            path: dir.join(super::manifest::MANIFEST_FILE),
            detail: format!(
                "format_version 1: no digest covers this manifest, so it cannot be signed; `convert add-kernels {}` rewrites the bundle as version {FORMAT_VERSION}",
                dir.display()
            ),
        }
        .into());
    };
    let statement = Statement::for_bundle(&bundle.manifest, &digests);
    let payload = serde_json::to_vec(&statement).expect("a statement serializes");
    let sig: Signature = key.sign(&pae(PAYLOAD_TYPE, &payload));
    let id = key_id(&key.verifying_key());
    let envelope = Envelope {
        payload: Base64::encode_string(&payload),
        payload_type: PAYLOAD_TYPE.into(),
        signatures: vec![EnvelopeSignature {
            keyid: id.clone(),
            sig: Base64::encode_string(&sig.to_bytes()),
        }],
    };
    let mut bytes = serde_json::to_vec_pretty(&envelope).expect("an envelope serializes");
    bytes.push(b'\n');
    let target = dir.join(SIGNATURE_FILE);
    let replaced = target.symlink_metadata().is_ok();
    let staging = util::StagingDir::beside(dir)?;
    let staged = staging.path().join(SIGNATURE_FILE);
    write_new_file(&staged, &bytes, 0o644)?;
    staging
        .publish(|| std::fs::rename(&staged, &target))
        .map_err(io(&target))?;
    Ok(SignSummary {
        signature: target,
        key_id: id,
        bundle_digest: digests.bundle_digest,
        manifest_digest: digests.manifest_digest,
        files: bundle.manifest.files.len(),
        replaced,
    })
}

/// A signature that checked out.
#[derive(Clone, Debug, Serialize)]
pub struct Signed {
    /// The id of the trusted key that verified it.
    pub key_id: String,
    /// The file that key was read from.
    pub key_file: String,
    pub bundle_digest: String,
    pub manifest_digest: String,
}

/// The key id `signature.json` names, read leniently (for `verify` without `--trusted-key`,
/// which reports a signature but does not judge it). `None` when the file is missing or not an
/// envelope.
pub fn signature_key_id(dir: &Path) -> Option<String> {
    let p = dir.join(SIGNATURE_FILE);
    let meta = std::fs::symlink_metadata(&p).ok()?;
    if !meta.is_file() || meta.len() > MAX_SIGNATURE_BYTES {
        return None;
    }
    let env: Envelope = serde_json::from_slice(&std::fs::read(&p).ok()?).ok()?;
    env.signatures.first().map(|s| s.keyid.clone())
}

/// Checks the bundle at `dir` (manifest `m`, its digests `computed` (versions 2 and 3) as read, `None`
/// for version 1) against `trusted` (see the module doc). On failure, every reason, named.
/// Does not hash the files: they are checked against `m` by
/// [`super::reader::check_integrity`], which every caller runs too.
pub fn check_signature(
    dir: &Path,
    m: &Manifest,
    computed: Option<&Digests>,
    trusted: &[PublicKey],
) -> Result<Signed, String> {
    let sig_name = SIGNATURE_FILE;
    let Some(computed) = computed else {
        return Err(format!(
            "format_version 1: the manifest is covered by no digest, so the bundle cannot be signed (`convert add-kernels` rewrites it as version {FORMAT_VERSION}, then `convert sign`)"
        ));
    };
    let p = dir.join(sig_name);
    let meta = match std::fs::symlink_metadata(&p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "unsigned: no {sig_name} (sign it with `convert sign BUNDLE --key KEY`)"
            ))
        }
        Err(e) => return Err(format!("{sig_name}: {e}")),
    };
    if !meta.is_file() {
        return Err(format!(
            "{sig_name}: not a regular file (symlinks are refused)"
        ));
    }
    if meta.len() > MAX_SIGNATURE_BYTES {
        return Err(format!(
            "{sig_name}: {} bytes is larger than the limit of {MAX_SIGNATURE_BYTES}",
            meta.len()
        ));
    }
    let bytes = std::fs::read(&p).map_err(|e| format!("{sig_name}: {e}"))?;
    let env: Envelope = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{sig_name}: not a DSSE envelope of a lowbit signature: {e}"))?;
    if env.payload_type != PAYLOAD_TYPE {
        return Err(format!(
            "{sig_name}: payloadType {:?}, expected {PAYLOAD_TYPE:?}",
            env.payload_type
        ));
    }
    let [es] = &env.signatures[..] else {
        return Err(format!(
            "{sig_name}: {} signatures; a lowbit signature holds exactly one",
            env.signatures.len()
        ));
    };
    let payload = Base64::decode_vec(&env.payload)
        .map_err(|e| format!("{sig_name}: payload is not base64: {e}"))?;
    let sig_bytes =
        Base64::decode_vec(&es.sig).map_err(|e| format!("{sig_name}: sig is not base64: {e}"))?;
    let sig_arr: [u8; 64] = sig_bytes.as_slice().try_into().map_err(|_| {
        format!(
            "{sig_name}: sig is {} bytes; an Ed25519 signature is 64",
            sig_bytes.len()
        )
    })?;
    let sig = Signature::from_bytes(&sig_arr);
    if trusted.is_empty() {
        return Err("no trusted key given".into());
    }
    let message = pae(&env.payload_type, &payload);
    let Some(key) = trusted
        .iter()
        .find(|k| k.key.verify_strict(&message, &sig).is_ok())
    else {
        let ids: Vec<String> = trusted
            .iter()
            .map(|k| format!("{} ({})", k.id, k.path.display()))
            .collect();
        return Err(match trusted.iter().find(|k| k.id == es.keyid) {
            Some(k) => format!(
                "{sig_name}: the signature does not verify with trusted key {} ({}): {sig_name} was changed after signing",
                k.id,
                k.path.display()
            ),
            None => format!(
                "{sig_name}: signed by key {}, which is not a trusted key (trusted: {}), or the signature was changed",
                es.keyid,
                ids.join(", ")
            ),
        });
    };
    // The signature is good: the statement is what the key holder signed.
    let st: Statement = serde_json::from_slice(&payload).map_err(|e| {
        format!("{sig_name}: the signed statement is not a lowbit bundle statement: {e}")
    })?;
    if st.type_ != STATEMENT_TYPE || st.predicate_type != PREDICATE_TYPE {
        return Err(format!(
            "{sig_name}: the signed statement is of type {:?} / {:?}, expected {STATEMENT_TYPE:?} / {PREDICATE_TYPE:?}",
            st.type_, st.predicate_type
        ));
    }
    let (Some(signed_bundle), Some(signed_manifest)) = (
        st.digest_of(SUBJECT_BUNDLE),
        st.digest_of(super::manifest::MANIFEST_FILE),
    ) else {
        return Err(format!(
            "{sig_name}: the signed statement lacks the {SUBJECT_BUNDLE:?} or {:?} subject",
            super::manifest::MANIFEST_FILE
        ));
    };
    if signed_bundle == computed.bundle_digest && signed_manifest == computed.manifest_digest {
        return Ok(Signed {
            key_id: key.id.clone(),
            key_file: key.path.display().to_string(),
            bundle_digest: computed.bundle_digest.clone(),
            manifest_digest: computed.manifest_digest.clone(),
        });
    }
    // Changed after signing: name what.
    let mut why = Vec::new();
    let signed: BTreeMap<&str, &FileEntry> = st
        .predicate
        .files
        .iter()
        .map(|f| (f.path.as_str(), f))
        .collect();
    let now: BTreeMap<&str, &FileEntry> = m.files.iter().map(|f| (f.path.as_str(), f)).collect();
    for (path, f) in &now {
        match signed.get(path) {
            None => why.push(format!("{path}: added after signing")),
            Some(s) if s != f => why.push(format!(
                "{path}: changed after signing (signed: {} bytes, {}; now {} bytes, {})",
                s.size,
                s.digest_text(),
                f.size,
                f.digest_text()
            )),
            Some(_) => {}
        }
    }
    for path in signed.keys().filter(|p| !now.contains_key(*p)) {
        why.push(format!("{path}: removed after signing"));
    }
    let mname = super::manifest::MANIFEST_FILE;
    if signed_bundle != computed.bundle_digest && why.is_empty() {
        why.push(format!(
            "{mname}: changed after signing: its content (model configuration, functions, tensors, tokenizer reference, kernels, source) hashes to bundle digest {}, the signature covers {signed_bundle}",
            computed.bundle_digest
        ));
    } else if signed_bundle == computed.bundle_digest {
        why.push(format!(
            "{mname}: changed after signing: its producer differs (manifest digest {}, the signature covers {signed_manifest})",
            computed.manifest_digest
        ));
    }
    Err(why.join("; "))
}

/// [`check_signature`] for an opened bundle, as a [`BundleError::Signature`] naming the bundle.
pub fn verify_signature(bundle: &Bundle, trusted: &[PublicKey]) -> Result<Signed, BundleError> {
    check_signature(
        &bundle.dir,
        &bundle.manifest,
        bundle.digests.as_ref(),
        trusted,
    )
    .map_err(|detail| BundleError::Signature {
        path: bundle.dir.clone(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
    }

    #[test]
    fn pem_labels() {
        assert_eq!(
            pem_label("junk\n-----BEGIN PUBLIC KEY-----\nAA==\n"),
            Some("PUBLIC KEY")
        );
        assert_eq!(pem_label("-----BEGIN "), None);
        assert_eq!(pem_label(""), None);
    }

    /// The RFC 8410 section 10.3 example private key reads, and its public key has the id
    /// of the example's SubjectPublicKeyInfo (section 10.1).
    #[test]
    fn rfc8410_example_keys() {
        let d = tempfile::tempdir().unwrap();
        let (k, p) = (d.path().join("k"), d.path().join("k.pub"));
        std::fs::write(
            &k,
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        std::fs::write(
            &p,
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
        )
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let sk = read_signing_key(&k).unwrap();
        let pk = read_public_key(&p).unwrap();
        assert_eq!(sk.verifying_key(), pk.key);
        assert_eq!(
            pk.id,
            util::sha256_hex(
                &Base64::decode_vec("MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=")
                    .unwrap()
            )
        );
        // What lowbit writes for it is the same document.
        assert_eq!(
            private_pem(&sk).as_str(),
            std::fs::read_to_string(&k).unwrap()
        );
        assert_eq!(public_pem(&pk.key), std::fs::read_to_string(&p).unwrap());
    }
}
