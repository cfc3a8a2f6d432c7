//! The atomics and cells every concurrent structure of the runtime uses.
//!
//! One module, so that the loom model checker is swapped in under `cfg(loom)`
//! without touching the structures themselves (as crossbeam does).

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// An `UnsafeCell` with closure access, so that loom can track every access.
#[derive(Debug)]
pub struct UnsafeCell<T> {
    #[cfg(not(loom))]
    inner: core::cell::UnsafeCell<T>,
    #[cfg(loom)]
    inner: loom::cell::UnsafeCell<T>,
}

impl<T> UnsafeCell<T> {
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Self {
        UnsafeCell {
            inner: core::cell::UnsafeCell::new(value),
        }
    }
    #[cfg(loom)]
    pub fn new(value: T) -> Self {
        UnsafeCell {
            inner: loom::cell::UnsafeCell::new(value),
        }
    }

    /// Runs `f` on a shared pointer to the value.
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(not(loom))]
        return f(self.inner.get());
        #[cfg(loom)]
        return self.inner.with(f);
    }

    /// Runs `f` on an exclusive pointer to the value.
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(not(loom))]
        return f(self.inner.get());
        #[cfg(loom)]
        return self.inner.with_mut(f);
    }
}

/// `const fn` outside loom (mailboxes live in statics on the device); a plain
/// `fn` under loom, whose atomics cannot be built in const context.
macro_rules! maybe_const_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident() -> $ret:ty $body:block) => {
        #[cfg(not(loom))]
        $(#[$m])* $vis const fn $name() -> $ret $body
        #[cfg(loom)]
        $(#[$m])* $vis fn $name() -> $ret $body
    };
}
pub(crate) use maybe_const_fn;
