//! SCRAM-SHA-256 password verifiers, as PostgreSQL stores them in `pg_authid.rolpassword`
//! (RFC 5802 and 7677, `src/common/scram-common.c`): pure but for the random salt.
//!
//! The operator sends PostgreSQL a verifier, never the password (as `psql`'s `\password` does),
//! so the password is in no statement, server log or `pg_stat_activity`; and it tells whether
//! a role's password is still the Secret's by recomputing the stored verifier from the
//! Secret with its salt, so nothing is altered while nothing changed.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::{digest, hmac, pbkdf2};
use std::num::NonZeroU32;

/// PostgreSQL's default `scram_iterations`.
const ITERATIONS: u32 = 4096;
/// PostgreSQL's salt length.
const SALT_LEN: usize = 16;
const PREFIX: &str = "SCRAM-SHA-256$";

/// A new verifier of `password`, with a random salt.
pub fn verifier(password: &[u8]) -> String {
    let mut salt = [0u8; SALT_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
        .expect("the system's random source works");
    verifier_with(password, &salt, ITERATIONS)
}

/// Whether `stored` (a `rolpassword`) is a SCRAM-SHA-256 verifier of `password`. An MD5 hash,
/// a malformed value or none is not: the password is set again.
pub fn matches(stored: &str, password: &[u8]) -> bool {
    let Some((iterations, salt)) = parse(stored) else {
        return false;
    };
    verifier_with(password, &salt, iterations) == stored
}

/// The iteration count and salt of a stored verifier.
fn parse(stored: &str) -> Option<(u32, Vec<u8>)> {
    let rest = stored.strip_prefix(PREFIX)?;
    let (params, _keys) = rest.split_once('$')?;
    let (iterations, salt) = params.split_once(':')?;
    let iterations: u32 = iterations.parse().ok().filter(|i| *i > 0)?;
    Some((iterations, STANDARD.decode(salt).ok()?))
}

fn verifier_with(password: &[u8], salt: &[u8], iterations: u32) -> String {
    let prepared = prepare(password);
    let mut salted = [0u8; digest::SHA256_OUTPUT_LEN];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        NonZeroU32::new(iterations).expect("checked above"),
        salt,
        &prepared,
        &mut salted,
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&key, b"Client Key");
    let stored_key = digest::digest(&digest::SHA256, client_key.as_ref());
    let server_key = hmac::sign(&key, b"Server Key");
    format!(
        "{PREFIX}{iterations}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key.as_ref()),
        STANDARD.encode(server_key.as_ref())
    )
}

/// SASLprep of the password where it applies, else its bytes, as PostgreSQL and libpq do
/// (`pg_saslprep`): a password that is not UTF-8 or has prohibited characters is used as is.
fn prepare(password: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(password).map(stringprep::saslprep) {
        Ok(Ok(prepared)) => prepared.into_owned().into_bytes(),
        _ => password.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed independently, with Python's `hashlib.pbkdf2_hmac` and `hmac`, for salt
    /// 00 01 .. 0f.
    const VECTOR: &str = "SCRAM-SHA-256$4096:AAECAwQFBgcICQoLDA0ODw==$ONYbSJBXtKl6bP6PVqw8pm9e7EiacprLnoUQPFS80Hw=:IPOtHuGJ2HifEQg74W2XXqqCrCyQG55GbPRHa6g6n9w=";

    #[test]
    fn a_verifier_is_postgresql_s_for_the_same_salt() {
        let salt: Vec<u8> = (0..16).collect();
        assert_eq!(
            verifier_with(b"correct horse battery staple", &salt, 4096),
            VECTOR
        );
        assert!(matches(VECTOR, b"correct horse battery staple"));
        assert!(!matches(VECTOR, b"correct horse battery stapler"));
    }

    #[test]
    fn a_new_verifier_has_a_fresh_salt_and_matches_its_password() {
        let (a, b) = (verifier(b"s3cret"), verifier(b"s3cret"));
        assert_ne!(a, b, "random salts");
        assert!(matches(&a, b"s3cret") && matches(&b, b"s3cret"));
        assert!(a.starts_with("SCRAM-SHA-256$4096:"));
        assert!(!a.contains("s3cret"));
    }

    #[test]
    fn other_stored_values_never_match() {
        for stored in [
            "",
            "md5a3556571e93b0d20722ba62be61e8c2d",
            "SCRAM-SHA-256$0:AAEC$x:y",
            "SCRAM-SHA-256$4096:not base64!$x:y",
            "SCRAM-SHA-256$4096",
        ] {
            assert!(!matches(stored, b"pw"), "{stored}");
        }
    }

    #[test]
    fn unicode_passwords_are_prepared_as_postgresql_prepares_them() {
        // U+00A0 (no-break space) maps to a space under SASLprep; PostgreSQL hashes the mapped
        // form, so both spellings log in.
        let stored = verifier("pass\u{a0}word".as_bytes());
        assert!(matches(&stored, b"pass word"));
    }
}
