//! Client authentication and access control: users from the configuration, each with a
//! salted, stretched password hash, permissions by command category (read, write, admin)
//! and the keyspaces it may use; the category of every command; and the deduplication
//! ids of an authenticated user, derived from its name so that no other user can reach
//! them. Pure apart from the clock-free hashing: the front door (`front_door`) asks.
//!
//! Passwords are stored as `pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>`
//! (PBKDF2-HMAC-SHA256, a 32-byte hash), made by `keel passwd`; they are checked in
//! constant time. Without any user the node runs in protected mode
//! (`front_door::connection`): it serves loopback clients only, as Redis does.

use keel_types::{ClientId, KeyspaceId};
use keel_wire::command::ClientCommand;
use ring::{digest, pbkdf2};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::Arc;

/// Fewest PBKDF2 iterations a configured hash may use.
pub const ITERATIONS_MIN: u32 = 1_000;
/// Most PBKDF2 iterations a configured hash may use (each AUTH costs them).
pub const ITERATIONS_MAX: u32 = 1_000_000;
/// Iterations `keel passwd` uses: a few ms of one core per `AUTH` (`keel passwd` runs in
/// 7 ms here, start-up included).
pub const ITERATIONS_DEFAULT: u32 = 10_000;
/// The name `AUTH <password>` (no user name) authenticates as, as in Redis.
pub const DEFAULT_USER: &str = "default";

/// A command's category, for permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Reads of keys (`GET`, `MGET`, `EXISTS`, `KEEL.SCAN`).
    Read,
    /// Writes of keys (`SET`, `DEL`, `INCR` and kin, `KEEL.CAS`) and queues
    /// (`KEEL.ENQUEUE`, `KEEL.DEQUEUE`).
    Write,
    /// What shows or changes the node itself (`KEEL.LOG`, `CLIENT KILL`).
    Admin,
}

/// The category of `command`; `None`: a connection command any authenticated user may
/// run (`PING`, `HELLO`, `SELECT`, `CLIENT SETNAME`, `INFO`, `KEEL.STATUS`, ...).
pub fn category(command: &ClientCommand) -> Option<Category> {
    match command {
        ClientCommand::Get { .. }
        | ClientCommand::MGet { .. }
        | ClientCommand::Exists { .. }
        | ClientCommand::Scan { .. }
        | ClientCommand::Ttl { .. }
        | ClientCommand::DbSize
        | ClientCommand::Keys { .. }
        | ClientCommand::ScanKeys { .. }
        | ClientCommand::ReadString { .. }
        | ClientCommand::Lcs { .. }
        | ClientCommand::RandomKey
        | ClientCommand::QueuePeek { .. }
        | ClientCommand::CollRead { .. } => Some(Category::Read),
        ClientCommand::Flush { .. }
        | ClientCommand::SwapDb { .. }
        | ClientCommand::Node { .. }
        | ClientCommand::Slots { .. }
        | ClientCommand::FunctionFlush
        | ClientCommand::ConfigSet { .. }
        | ClientCommand::ConfigResetStat
        | ClientCommand::DebugSleep(_)
        | ClientCommand::Client(
            keel_wire::command::ClientSubcommand::List { .. }
            | keel_wire::command::ClientSubcommand::Kill { .. }
            | keel_wire::command::ClientSubcommand::Unblock { .. },
        ) => Some(Category::Admin),
        ClientCommand::Set { .. }
        | ClientCommand::MSet { .. }
        | ClientCommand::Modify { .. }
        | ClientCommand::Transfer { .. }
        | ClientCommand::Expire { .. }
        | ClientCommand::Del { .. }
        | ClientCommand::Incr { .. }
        | ClientCommand::Cas { .. }
        | ClientCommand::Enqueue { .. }
        | ClientCommand::Dequeue { .. }
        | ClientCommand::Coll { .. }
        | ClientCommand::Block { .. }
        | ClientCommand::PubSub(keel_wire::command::PubSubCommand::Publish { .. }) => {
            Some(Category::Write)
        }
        ClientCommand::PubSub(_) => Some(Category::Read),
        _ => None,
    }
}

/// One user as configured (`[[users]]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSettings {
    /// Its name (what `AUTH <name> <password>` names; `default` for `AUTH <password>`).
    pub name: String,
    /// `pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>`, from `keel passwd`.
    pub password_hash: String,
    /// What it may do: any of `read`, `write`, `admin`.
    pub permissions: Vec<Category>,
    /// The keyspaces it may use; absent: every keyspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyspaces: Option<Vec<u32>>,
}

/// A stored password hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PasswordHash {
    iterations: NonZeroU32,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

impl PasswordHash {
    /// Hashes `password` with `salt` (16 bytes or more) and `iterations`.
    pub fn new(password: &[u8], salt: &[u8], iterations: u32) -> PasswordHash {
        let iterations = NonZeroU32::new(iterations).expect("iterations are positive");
        let mut hash = vec![0u8; digest::SHA256_OUTPUT_LEN];
        pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, iterations, salt, password, &mut hash);
        PasswordHash { iterations, salt: salt.to_vec(), hash }
    }

    /// Parses the stored form; the reason when it is not one.
    pub fn parse(text: &str) -> Result<PasswordHash, String> {
        let parts: Vec<&str> = text.split('$').collect();
        let [scheme, iterations, salt, hash] = parts[..] else {
            return Err("expected pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>".into());
        };
        if scheme != "pbkdf2-sha256" {
            return Err(format!("unknown scheme {scheme:?} (only pbkdf2-sha256)"));
        }
        let iterations: u32 = iterations.parse().map_err(|_| "iterations: not a number")?;
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
            return Err(format!("iterations must be in {ITERATIONS_MIN}..={ITERATIONS_MAX}"));
        }
        let salt = from_hex(salt).ok_or("salt: not hex")?;
        let hash = from_hex(hash).ok_or("hash: not hex")?;
        if salt.len() < 16 || hash.len() != digest::SHA256_OUTPUT_LEN {
            return Err("salt must have 16 bytes or more and the hash 32".into());
        }
        let iterations = NonZeroU32::new(iterations).expect("checked above");
        Ok(PasswordHash { iterations, salt, hash })
    }

    /// Whether `password` is the one hashed (in constant time).
    pub fn verify(&self, password: &[u8]) -> bool {
        let algorithm = pbkdf2::PBKDF2_HMAC_SHA256;
        pbkdf2::verify(algorithm, self.iterations, &self.salt, password, &self.hash).is_ok()
    }
}

impl std::fmt::Display for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pbkdf2-sha256${}${}${}", self.iterations, hex(&self.salt), hex(&self.hash))
    }
}

/// The stored form of `password` with a fresh random 16-byte salt.
pub fn hash_password(password: &[u8], iterations: u32) -> String {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut salt).expect("the system random generator works");
    PasswordHash::new(password, &salt, iterations).to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

/// A configured user, ready to check.
#[derive(Debug)]
pub struct User {
    /// Its name.
    pub name: String,
    hash: PasswordHash,
    permissions: BTreeSet<Category>,
    keyspaces: Option<BTreeSet<u32>>,
    /// SHA-256 of its name: mixed into its deduplication ids.
    id_key: [u8; 32],
}

impl User {
    /// Whether the user may run commands of `category` in `keyspace`.
    pub fn may(&self, category: Category, keyspace: KeyspaceId) -> bool {
        self.permissions.contains(&category) && self.may_use(keyspace)
    }

    /// Whether the user may use `keyspace` at all.
    pub fn may_use(&self, keyspace: KeyspaceId) -> bool {
        self.keyspaces.as_ref().is_none_or(|set| set.contains(&keyspace.0))
    }

    /// The deduplication id the engine sees for this user's id `id`: SHA-256 of the
    /// user's name and `id`, so that another user cannot name (and so advance or replay)
    /// this user's ids, whatever id it sends.
    pub fn client_id(&self, id: u64) -> ClientId {
        let mut context = digest::Context::new(&digest::SHA256);
        context.update(&self.id_key);
        context.update(&id.to_le_bytes());
        let out = context.finish();
        let raw = u64::from_le_bytes(out.as_ref()[..8].try_into().expect("8 bytes"));
        // Positive, in the namespace `id` is in: below 2^63 for a plain id, with
        // `ClientId::SESSION_BIT` for a session's.
        let session = id & ClientId::SESSION_BIT;
        ClientId(((raw >> 1) | session).max(1))
    }
}

/// Every configured user, by name.
#[derive(Debug, Default)]
pub struct Users {
    by_name: BTreeMap<String, Arc<User>>,
}

impl Users {
    /// The users of the configuration, checked; the reason naming the user otherwise.
    pub fn new(settings: &[UserSettings]) -> Result<Users, String> {
        let mut by_name = BTreeMap::new();
        for user in settings {
            let name = &user.name;
            if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("user {name:?}: 1 to 64 printable ASCII characters"));
            }
            let hash = PasswordHash::parse(&user.password_hash)
                .map_err(|e| format!("user {name}: password_hash: {e}"))?;
            let keyspaces = user.keyspaces.as_ref().map(|k| k.iter().copied().collect());
            let id_key: [u8; 32] = digest::digest(&digest::SHA256, name.as_bytes())
                .as_ref()
                .try_into()
                .expect("32 bytes");
            let permissions = user.permissions.iter().copied().collect();
            let entry = Arc::new(User { name: name.clone(), hash, permissions, keyspaces, id_key });
            if by_name.insert(name.clone(), entry).is_some() {
                return Err(format!("user {name} is configured twice"));
            }
        }
        Ok(Users { by_name })
    }

    /// Whether any user is configured (then every client must authenticate).
    pub fn required(&self) -> bool {
        !self.by_name.is_empty()
    }

    /// The user `name` if `password` is its password. An unknown name costs a hash too,
    /// at the default iterations (so a failed attempt does not tell cheaply whether the
    /// name exists; a user configured with other iterations costs more or less).
    pub fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<Arc<User>> {
        self.check(name, password).ok()
    }

    /// As [`Users::authenticate`], saying why it failed (for the node's own counts and
    /// log, never for the client, which is told the same for both). Costs one PBKDF2
    /// hash, a few milliseconds of CPU: callers run it off the runtime (`login`).
    pub fn check(&self, name: &[u8], password: &[u8]) -> Result<Arc<User>, Refusal> {
        let user = std::str::from_utf8(name).ok().and_then(|n| self.by_name.get(n));
        match user {
            Some(user) if user.hash.verify(password) => Ok(user.clone()),
            Some(_) => Err(Refusal::WrongPassword),
            None => {
                let decoy = PasswordHash {
                    iterations: NonZeroU32::new(ITERATIONS_DEFAULT).expect("positive"),
                    salt: vec![0; 16],
                    hash: vec![0; 32],
                };
                let _ = decoy.verify(password);
                Err(Refusal::UnknownUser)
            }
        }
    }
}

/// Why a password check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The user exists; the password is not its.
    WrongPassword,
    /// No user has that name.
    UnknownUser,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(name: &str, password: &str, permissions: &[Category]) -> UserSettings {
        let hash = PasswordHash::new(password.as_bytes(), b"a salt of 16 b..", ITERATIONS_MIN);
        UserSettings {
            name: name.into(),
            password_hash: hash.to_string(),
            permissions: permissions.to_vec(),
            keyspaces: None,
        }
    }

    #[test]
    fn hashes_round_trip_and_verify_only_their_password() {
        let hash = PasswordHash::new(b"hunter2", b"0123456789abcdef", 1_000);
        let text = hash.to_string();
        assert!(text.starts_with("pbkdf2-sha256$1000$"));
        let parsed = PasswordHash::parse(&text).unwrap();
        assert!(parsed.verify(b"hunter2"));
        assert!(!parsed.verify(b"hunter3"));
        for bad in ["", "md5$1$00$00", "pbkdf2-sha256$10$00112233445566778899aabbccddeeff$00"] {
            assert!(PasswordHash::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn users_authenticate_by_name_and_are_checked_by_category_and_keyspace() {
        let mut reader = settings("reader", "r-pass", &[Category::Read]);
        reader.keyspaces = Some(vec![1]);
        let users = Users::new(&[reader, settings("admin", "a-pass", &[Category::Admin])]).unwrap();
        assert!(users.required());
        assert!(users.authenticate(b"reader", b"a-pass").is_none());
        assert!(users.authenticate(b"nobody", b"r-pass").is_none());
        let reader = users.authenticate(b"reader", b"r-pass").expect("its own password");
        assert!(reader.may(Category::Read, KeyspaceId(1)));
        assert!(!reader.may(Category::Read, KeyspaceId(0)), "not its keyspace");
        assert!(!reader.may(Category::Write, KeyspaceId(1)), "not its category");
        assert!(Users::new(&[settings("x", "p", &[]), settings("x", "q", &[])]).is_err());
    }

    #[test]
    fn dedup_ids_are_per_user() {
        let users = Users::new(&[
            settings("a", "p", &[Category::Write]),
            settings("b", "p", &[Category::Write]),
        ])
        .unwrap();
        let (a, b) =
            (users.authenticate(b"a", b"p").unwrap(), users.authenticate(b"b", b"p").unwrap());
        assert_eq!(a.client_id(7), a.client_id(7));
        assert_ne!(a.client_id(7), b.client_id(7), "another user's id 7 is another id");
        assert_ne!(a.client_id(7), a.client_id(8));
        assert!(a.client_id(7).0 < 1 << 63 && a.client_id(7).0 > 0);
        let session = ClientId::SESSION_BIT | 7;
        assert!(a.client_id(session).is_session(), "a session's id stays a session's");
        assert_ne!(a.client_id(session), b.client_id(session));
    }
}
