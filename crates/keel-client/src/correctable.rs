//! Correctables (Guerraoui, Pavlovic and Seredinschi, "Incremental Consistency Guarantees
//! for Replicated Objects", OSDI 2016): one operation's result as a sequence of *views*
//! of increasing strength. Preliminary views come fast at weak levels; the final view, at
//! the strongest level asked for, closes the [`Correctable`]. An application may act on a
//! preliminary view and undo that work if the final view differs ([`Correctable::speculate`]).
//!
//! States (`docs/correctables.md`):
//!
//! ```text
//!   updating ──view──► updating      (a preliminary view; on_update callbacks)
//!   updating ──final─► final         (terminal; on_final callbacks)
//!   updating ──error─► error         (terminal; on_error callbacks)
//! ```
//!
//! The producing side is a [`Resolver`], held by whatever talks to the store (a binding).
//! It enforces the rules the consumer relies on: views arrive with strictly increasing
//! levels, nothing is delivered after the Correctable closes, and a resolver dropped
//! without closing fails it (so a consumer never waits for ever). A view it refuses is
//! counted ([`Correctable::refused`]), never delivered.
//!
//! Callbacks attached late are not cheated of what already happened: `on_update` replays
//! the preliminary views delivered so far, `on_final` and `on_error` fire at once on a
//! closed Correctable. Callbacks run on the thread that delivers the view, under the
//! Correctable's lock: they must not call back into the same Correctable (they may touch
//! others, as `speculate` does).

use crate::error::ClientError;
use keel_types::{ReadLevel, Version};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// One view of an operation's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View<T> {
    /// The level this view satisfies.
    pub level: ReadLevel,
    /// The result at that level.
    pub value: T,
    /// The version it was read at, when the store says.
    pub version: Option<Version>,
}

/// Where a [`Correctable`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Open: zero or more preliminary views so far.
    Updating,
    /// Closed with its final view.
    Final,
    /// Closed with an error.
    Error,
}

type ViewCallback<T> = Box<dyn FnMut(&View<T>) + Send>;
type ErrorCallback = Box<dyn FnMut(&ClientError) + Send>;

struct Inner<T> {
    /// Preliminary views delivered, in order.
    preliminary: Vec<View<T>>,
    /// How it closed, once it has.
    closed: Option<Result<View<T>, ClientError>>,
    on_update: Vec<ViewCallback<T>>,
    on_final: Vec<ViewCallback<T>>,
    on_error: Vec<ErrorCallback>,
    refused: u64,
}

impl<T> Inner<T> {
    fn state(&self) -> State {
        match &self.closed {
            None => State::Updating,
            Some(Ok(_)) => State::Final,
            Some(Err(_)) => State::Error,
        }
    }

    /// The level a new view must exceed.
    fn last_level(&self) -> Option<ReadLevel> {
        self.preliminary.last().map(|view| view.level)
    }
}

struct Shared<T> {
    inner: Mutex<Inner<T>>,
    changed: Notify,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // A panicking callback must not wedge every later reader.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The consuming side: a handle on one operation's views (cheap to clone).
pub struct Correctable<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Correctable<T> {
    fn clone(&self) -> Self {
        Correctable { shared: self.shared.clone() }
    }
}

impl<T> std::fmt::Debug for Correctable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("Correctable")
            .field("state", &inner.state())
            .field("preliminary", &inner.preliminary.len())
            .finish()
    }
}

/// The producing side: delivers views to its [`Correctable`], then closes it.
pub struct Resolver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> std::fmt::Debug for Resolver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

/// A fresh, open Correctable and the resolver that feeds it.
pub fn correctable<T: Clone + Send + 'static>() -> (Correctable<T>, Resolver<T>) {
    let inner = Inner {
        preliminary: Vec::new(),
        closed: None,
        on_update: Vec::new(),
        on_final: Vec::new(),
        on_error: Vec::new(),
        refused: 0,
    };
    let shared = Arc::new(Shared { inner: Mutex::new(inner), changed: Notify::new() });
    (Correctable { shared: shared.clone() }, Resolver { shared })
}

impl<T: Clone + Send + 'static> Resolver<T> {
    /// Delivers a preliminary view. Refused (and counted) if the Correctable is closed or
    /// the view's level does not exceed the last one's; returns whether it was delivered.
    pub fn update(&self, view: View<T>) -> bool {
        let mut inner = self.shared.lock();
        let in_order = inner.last_level().is_none_or(|last| view.level > last);
        if inner.closed.is_some() || !in_order {
            inner.refused += 1;
            return false;
        }
        for callback in &mut inner.on_update {
            callback(&view);
        }
        inner.preliminary.push(view);
        drop(inner);
        self.shared.changed.notify_waiters();
        true
    }

    /// Closes with the final view. A final view weaker than a preliminary one is refused
    /// (counted) and the Correctable fails instead: its promise of increasing strength
    /// cannot be kept.
    pub fn close(self, view: View<T>) -> bool {
        let level = view.level;
        let in_order = self.shared.lock().last_level().is_none_or(|last| level > last);
        if !in_order {
            self.shared.lock().refused += 1;
            let why =
                format!("a final view at {} after a stronger preliminary one", level.as_str());
            self.finish(Err(ClientError::Unexpected(why)));
            return false;
        }
        self.finish(Ok(view))
    }

    /// Closes with an error.
    pub fn fail(self, error: ClientError) -> bool {
        self.finish(Err(error))
    }
}

impl<T> Resolver<T> {
    fn finish(&self, outcome: Result<View<T>, ClientError>) -> bool {
        let mut inner = self.shared.lock();
        if inner.closed.is_some() {
            inner.refused += 1;
            return false;
        }
        match &outcome {
            Ok(view) => inner.on_final.iter_mut().for_each(|callback| callback(view)),
            Err(error) => inner.on_error.iter_mut().for_each(|callback| callback(error)),
        }
        inner.closed = Some(outcome);
        // Nothing fires again: drop what the callbacks hold.
        inner.on_update.clear();
        inner.on_final.clear();
        inner.on_error.clear();
        drop(inner);
        self.shared.changed.notify_waiters();
        true
    }
}

impl<T> Drop for Resolver<T> {
    fn drop(&mut self) {
        let open = self.shared.lock().closed.is_none();
        if open {
            let error = ClientError::Unexpected("the operation ended without a final view".into());
            self.finish(Err(error));
        }
    }
}

impl<T: Clone + Send + 'static> Correctable<T> {
    /// Where it is now.
    pub fn state(&self) -> State {
        self.shared.lock().state()
    }

    /// The preliminary views delivered so far, in order.
    pub fn preliminary(&self) -> Vec<View<T>> {
        self.shared.lock().preliminary.clone()
    }

    /// Views the resolver tried to deliver out of order or after closing (never
    /// delivered).
    pub fn refused(&self) -> u64 {
        self.shared.lock().refused
    }

    /// Calls `f` on each preliminary view, those already delivered first.
    pub fn on_update(&self, f: impl FnMut(&View<T>) + Send + 'static) -> &Self {
        let mut f: ViewCallback<T> = Box::new(f);
        let mut inner = self.shared.lock();
        inner.preliminary.iter().for_each(&mut f);
        if inner.closed.is_none() {
            inner.on_update.push(f);
        }
        self
    }

    /// Calls `f` on the final view (at once if it has come).
    pub fn on_final(&self, f: impl FnMut(&View<T>) + Send + 'static) -> &Self {
        let mut f: ViewCallback<T> = Box::new(f);
        let mut inner = self.shared.lock();
        match &inner.closed {
            None => inner.on_final.push(f),
            Some(Ok(view)) => f(view),
            Some(Err(_)) => {}
        }
        self
    }

    /// Calls `f` on the error the Correctable closes with (at once if it has).
    pub fn on_error(&self, f: impl FnMut(&ClientError) + Send + 'static) -> &Self {
        let mut f: ErrorCallback = Box::new(f);
        let mut inner = self.shared.lock();
        match &inner.closed {
            None => inner.on_error.push(f),
            Some(Err(error)) => f(error),
            Some(Ok(_)) => {}
        }
        self
    }

    /// Waits for the final view (or the error).
    pub async fn final_view(&self) -> Result<View<T>, ClientError> {
        loop {
            let changed = self.shared.changed.notified();
            if let Some(outcome) = &self.shared.lock().closed {
                return outcome.clone();
            }
            changed.await;
        }
    }

    /// Every view in order, preliminary ones then the final one: an async stream read
    /// with [`Views::next`].
    pub fn views(&self) -> Views<T> {
        Views { correctable: self.clone(), next: 0, done: false }
    }

    /// Speculates on the views: runs `f` on each view whose value differs from the last
    /// one `f` ran on, and returns a Correctable of its results (at the same levels).
    /// When the final view comes, the derived Correctable closes with `f`'s last result
    /// if the final value equals the one it ran on; otherwise `abort` gets that result,
    /// `f` runs again on the final value, and the derived Correctable closes with that.
    /// An error closes it with the error (after `abort` on any speculative result).
    pub fn speculate<U, F, A>(&self, f: F, abort: A) -> Correctable<U>
    where
        T: PartialEq,
        U: Clone + Send + 'static,
        F: FnMut(&T) -> U + Send + 'static,
        A: FnMut(&U) + Send + 'static,
    {
        let (derived, resolver) = correctable::<U>();
        struct Speculation<T, U, F, A> {
            f: F,
            abort: A,
            /// The value `f` last ran on, and what it gave.
            last: Option<(T, U)>,
            resolver: Option<Resolver<U>>,
        }
        let state =
            Arc::new(Mutex::new(Speculation { f, abort, last: None, resolver: Some(resolver) }));
        let on_update = state.clone();
        self.on_update(move |view| {
            let mut s = on_update.lock().unwrap_or_else(|p| p.into_inner());
            if s.last.as_ref().is_some_and(|(value, _)| *value == view.value) {
                return;
            }
            let result = (s.f)(&view.value);
            s.last = Some((view.value.clone(), result.clone()));
            if let Some(resolver) = &s.resolver {
                resolver.update(View { level: view.level, value: result, version: view.version });
            }
        });
        let on_final = state.clone();
        self.on_final(move |view| {
            let mut s = on_final.lock().unwrap_or_else(|p| p.into_inner());
            let result = match s.last.take() {
                Some((value, result)) if value == view.value => result,
                Some((_, result)) => {
                    (s.abort)(&result);
                    (s.f)(&view.value)
                }
                None => (s.f)(&view.value),
            };
            if let Some(resolver) = s.resolver.take() {
                resolver.close(View { level: view.level, value: result, version: view.version });
            }
        });
        let on_error = state;
        self.on_error(move |error| {
            let mut s = on_error.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, result)) = s.last.take() {
                (s.abort)(&result);
            }
            if let Some(resolver) = s.resolver.take() {
                resolver.fail(error.clone());
            }
        });
        derived
    }
}

/// The views of a [`Correctable`] as an async stream.
#[derive(Debug)]
pub struct Views<T> {
    correctable: Correctable<T>,
    next: usize,
    done: bool,
}

impl<T: Clone + Send + 'static> Views<T> {
    /// The next view: each preliminary view in order, then the final one (`Some(Ok)`), or
    /// the error (`Some(Err)`); `None` after that.
    pub async fn next(&mut self) -> Option<Result<View<T>, ClientError>> {
        if self.done {
            return None;
        }
        loop {
            let changed = self.correctable.shared.changed.notified();
            {
                let inner = self.correctable.shared.lock();
                if let Some(view) = inner.preliminary.get(self.next) {
                    self.next += 1;
                    return Some(Ok(view.clone()));
                }
                if let Some(outcome) = &inner.closed {
                    self.done = true;
                    return Some(outcome.clone());
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::ReadLevel::{Any, Linearizable, Monotonic};

    fn view(level: ReadLevel, value: &str) -> View<String> {
        View { level, value: value.to_string(), version: None }
    }

    /// Records what each callback saw, in order.
    fn recorder(c: &Correctable<String>) -> Arc<Mutex<Vec<String>>> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (u, f, e) = (log.clone(), log.clone(), log.clone());
        c.on_update(move |v| u.lock().unwrap().push(format!("update {}", v.value)))
            .on_final(move |v| f.lock().unwrap().push(format!("final {}", v.value)))
            .on_error(move |_| e.lock().unwrap().push("error".to_string()));
        log
    }

    #[test]
    fn views_come_in_level_order_and_nothing_after_close() {
        let (c, r) = correctable::<String>();
        let log = recorder(&c);
        assert_eq!(c.state(), State::Updating);
        assert!(r.update(view(Any, "a")));
        assert!(!r.update(view(Any, "again")), "a level must exceed the last");
        assert!(r.update(view(Monotonic, "b")));
        assert!(r.close(view(Linearizable, "c")));
        assert_eq!(c.state(), State::Final);
        assert_eq!(*log.lock().unwrap(), ["update a", "update b", "final c"]);
        assert_eq!(c.refused(), 1);
    }

    #[test]
    fn a_final_weaker_than_a_preliminary_view_fails_the_correctable() {
        let (c, r) = correctable::<String>();
        let log = recorder(&c);
        r.update(view(Monotonic, "b"));
        assert!(!r.close(view(Any, "a")));
        assert_eq!(c.state(), State::Error);
        assert_eq!(*log.lock().unwrap(), ["update b", "error"]);
    }

    #[test]
    fn a_final_without_preliminaries_and_an_error_after_one_are_legal() {
        let (c, r) = correctable::<String>();
        let log = recorder(&c);
        r.close(view(Linearizable, "only"));
        assert_eq!(*log.lock().unwrap(), ["final only"]);
        let (c, r) = correctable::<String>();
        let log = recorder(&c);
        r.update(view(Any, "a"));
        r.fail(ClientError::Unexpected("lost".into()));
        assert_eq!(c.state(), State::Error);
        assert_eq!(*log.lock().unwrap(), ["update a", "error"], "no final after an error");
    }

    #[test]
    fn a_resolver_dropped_open_fails_the_correctable() {
        let (c, r) = correctable::<String>();
        let log = recorder(&c);
        drop(r);
        assert_eq!(c.state(), State::Error);
        assert_eq!(*log.lock().unwrap(), ["error"]);
    }

    #[test]
    fn callbacks_attached_late_see_what_already_happened() {
        let (c, r) = correctable::<String>();
        r.update(view(Any, "a"));
        r.update(view(Monotonic, "b"));
        r.close(view(Linearizable, "c"));
        let log = recorder(&c);
        assert_eq!(*log.lock().unwrap(), ["update a", "update b", "final c"]);
    }

    #[tokio::test]
    async fn views_stream_in_order_and_final_view_waits() {
        let (c, r) = correctable::<String>();
        let mut views = c.views();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.final_view().await }
        });
        let producer = tokio::spawn(async move {
            for (level, value) in [(Any, "a"), (Monotonic, "b")] {
                tokio::task::yield_now().await;
                r.update(view(level, value));
            }
            r.close(view(Linearizable, "c"));
        });
        let mut seen = Vec::new();
        while let Some(next) = views.next().await {
            seen.push(next.unwrap().value);
        }
        assert_eq!(seen, ["a", "b", "c"]);
        assert_eq!(waiter.await.unwrap().unwrap().value, "c");
        producer.await.unwrap();
    }

    /// Runs `speculate` over `prelims` then `last`; returns the calls it made and the
    /// derived Correctable's final value.
    fn speculation(prelims: &[&str], last: &str) -> (Vec<String>, String) {
        let (c, r) = correctable::<String>();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (f_calls, a_calls) = (calls.clone(), calls.clone());
        let derived = c.speculate(
            move |v: &String| {
                f_calls.lock().unwrap().push(format!("f({v})"));
                v.to_uppercase()
            },
            move |u: &String| a_calls.lock().unwrap().push(format!("abort({u})")),
        );
        for (value, level) in prelims.iter().zip([Any, Monotonic]) {
            r.update(view(level, value));
        }
        r.close(view(Linearizable, last));
        let outcome = derived.shared.lock().closed.clone();
        let calls = calls.lock().unwrap().clone();
        (calls, outcome.expect("closed").expect("final").value)
    }

    #[test]
    fn speculation_confirmed_by_the_final_view_runs_once() {
        let (calls, result) = speculation(&["x"], "x");
        assert_eq!(calls, ["f(x)"]);
        assert_eq!(result, "X");
    }

    #[test]
    fn speculation_refuted_by_the_final_view_aborts_and_reruns() {
        let (calls, result) = speculation(&["x"], "y");
        assert_eq!(calls, ["f(x)", "abort(X)", "f(y)"]);
        assert_eq!(result, "Y");
    }

    #[test]
    fn speculation_refuted_without_an_abort_function_reruns_and_an_error_aborts() {
        // No abort work (`|_| {}`): the refuted result is dropped, `f` runs on the final.
        let (c, r) = correctable::<String>();
        let runs = Arc::new(Mutex::new(0));
        let counted = runs.clone();
        let derived = c.speculate(
            move |v: &String| {
                *counted.lock().unwrap() += 1;
                v.len()
            },
            |_| {},
        );
        r.update(view(Any, "ab"));
        r.close(view(Linearizable, "abc"));
        let closed = derived.shared.lock().closed.clone().expect("closed");
        assert_eq!((closed.expect("final").value, *runs.lock().unwrap()), (3, 2));
        // An error after a speculation: the speculative result is aborted, the derived
        // Correctable fails.
        let (c, r) = correctable::<String>();
        let aborted = Arc::new(Mutex::new(Vec::new()));
        let seen = aborted.clone();
        let derived = c.speculate(
            |v: &String| v.clone(),
            move |u: &String| seen.lock().unwrap().push(u.clone()),
        );
        r.update(view(Any, "x"));
        r.fail(ClientError::Unexpected("gone".into()));
        assert_eq!(*aborted.lock().unwrap(), ["x"]);
        assert_eq!(derived.state(), State::Error);
    }

    #[test]
    fn identical_views_do_not_rerun_a_speculation() {
        let (calls, result) = speculation(&["x", "x"], "x");
        assert_eq!(calls, ["f(x)"]);
        assert_eq!(result, "X");
        let (calls, _) = speculation(&[], "z");
        assert_eq!(calls, ["f(z)"], "no preliminary: f runs once, on the final view");
    }
}
