//! The node's open client connections, for `CLIENT LIST`, `CLIENT INFO` and `CLIENT KILL`.
//!
//! Each connection registers when it starts and leaves when it ends (its [`Registered`]
//! guard). What `CLIENT LIST` shows of it that can change (its name, database, user, last
//! request) the connection writes into its entry when it changes; a request costs one
//! relaxed store. `CLIENT KILL` wakes the connection's reader, which closes it the next
//! time it waits for bytes (a request already with the engine is answered first).

use bytes::Bytes;
use keel_wire::command::KillFilter;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::Notify;

/// Every open connection of the node, by client id.
#[derive(Debug, Default)]
pub struct Clients {
    open: Mutex<BTreeMap<u64, Arc<Client>>>,
}

/// One connection as `CLIENT LIST` shows it.
#[derive(Debug)]
pub struct Client {
    id: u64,
    addr: SocketAddr,
    since: Instant,
    /// Milliseconds from `since` to its last request.
    last_ms: AtomicU64,
    db: AtomicU32,
    name: Mutex<Option<Bytes>>,
    user: Mutex<Option<String>>,
    /// Woken by `CLIENT KILL`.
    pub(super) kill: Notify,
}

/// A connection's place in [`Clients`], left when dropped.
#[derive(Debug)]
pub struct Registered {
    clients: Arc<Clients>,
    /// The connection's entry.
    pub entry: Arc<Client>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.entry.id);
    }
}

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Client>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers connection `id` from `addr`.
    pub fn register(self: &Arc<Self>, id: u64, addr: SocketAddr) -> Registered {
        let entry = Arc::new(Client {
            id,
            addr,
            since: Instant::now(),
            last_ms: AtomicU64::new(0),
            db: AtomicU32::new(0),
            name: Mutex::new(None),
            user: Mutex::new(None),
            kill: Notify::new(),
        });
        let previous = self.lock().insert(id, entry.clone());
        debug_assert!(previous.is_none(), "client ids are unique");
        Registered { clients: self.clone(), entry }
    }

    /// `CLIENT LIST` of the connections `ids` names (all when empty).
    pub fn list(&self, ids: &[u64]) -> String {
        let open: Vec<Arc<Client>> = self.lock().values().cloned().collect();
        open.iter()
            .filter(|c| ids.is_empty() || ids.contains(&c.id))
            .map(|c| c.line() + "\n")
            .collect()
    }

    /// Closes the connections `filter` picks (never `me` with `SKIPME yes`); how many.
    pub fn kill(&self, filter: &KillFilter, me: u64) -> usize {
        if filter.none {
            return 0;
        }
        let open: Vec<Arc<Client>> = self.lock().values().cloned().collect();
        let mut killed = 0;
        for client in open {
            let picked = filter.id.is_none_or(|id| id == client.id)
                && filter.addr.as_ref().is_none_or(|a| *a == client.addr.to_string())
                && filter.user.as_ref().is_none_or(|u| Some(u) == client.user().as_ref())
                && !(filter.skip_me && client.id == me);
            if picked {
                client.kill.notify_one();
                killed += 1;
            }
        }
        killed
    }
}

impl Client {
    /// Notes a request now.
    pub fn touch(&self) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Notes the database `SELECT` chose.
    pub fn set_db(&self, db: u32) {
        self.db.store(db, Ordering::Relaxed);
    }

    /// Notes the name `CLIENT SETNAME` or `HELLO ... SETNAME` gave.
    pub fn set_name(&self, name: Option<Bytes>) {
        *self.name.lock().unwrap_or_else(PoisonError::into_inner) = name;
    }

    /// Notes the user the connection authenticated as.
    pub fn set_user(&self, user: &str) {
        *self.user.lock().unwrap_or_else(PoisonError::into_inner) = Some(user.to_string());
    }

    fn user(&self) -> Option<String> {
        self.user.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Its line of `CLIENT LIST` (Redis's fields Keel knows; `user=default` on a node
    /// without users).
    pub fn line(&self) -> String {
        let age = self.since.elapsed().as_secs();
        let idle = age.saturating_sub(self.last_ms.load(Ordering::Relaxed) / 1000);
        let name = self.name.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let name = String::from_utf8_lossy(name.as_deref().unwrap_or_default()).into_owned();
        let user = self.user().unwrap_or_else(|| "default".to_string());
        format!(
            "id={} addr={} name={name} age={age} idle={idle} flags=N db={} user={user}",
            self.id,
            self.addr,
            self.db.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Clients;
    use keel_wire::command::KillFilter;
    use std::sync::Arc;

    #[test]
    fn kill_picks_by_every_filter_and_entries_leave_with_their_connection() {
        let clients = Arc::new(Clients::default());
        let a = clients.register(1, "127.0.0.1:5000".parse().unwrap());
        let b = clients.register(2, "127.0.0.1:5001".parse().unwrap());
        b.entry.set_user("app");
        assert_eq!(clients.list(&[]).lines().count(), 2);
        assert!(clients.list(&[2]).starts_with("id=2 addr=127.0.0.1:5001 name= "));
        let by_user = KillFilter { user: Some("app".into()), skip_me: true, ..Default::default() };
        assert_eq!(clients.kill(&by_user, 1), 1);
        let everyone = KillFilter { skip_me: true, ..Default::default() };
        assert_eq!(clients.kill(&everyone, 1), 1, "not the one asking");
        let by_addr = KillFilter { addr: Some("127.0.0.1:5000".into()), ..Default::default() };
        assert_eq!(clients.kill(&by_addr, 2), 1);
        drop(a);
        assert_eq!(clients.list(&[]).lines().count(), 1);
    }
}
