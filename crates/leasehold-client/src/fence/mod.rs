//! Storage-side fencing: the resource itself refuses a stale holder.
//!
//! Client-side checks ([`crate::SessionGuard::gate`]) cannot stop a
//! process that passed its check and was then paused (a GC pause, a stopped
//! VM, a slow disk) while its write was already on its way: by the time the
//! write lands, another holder may own the key. Kleppmann's remedy is to make
//! the storage compare fencing tokens: every write carries the writer's
//! fence, the storage remembers the highest fence it has accepted for the
//! key, and it refuses any lower one. leasehold's fences strictly increase
//! with every grant and survive restarts, so a newer holder always presents
//! a higher fence than any older one.
//!
//! [`sqlite`] implements this for applications that keep their sessions in
//! their own SQLite database; its docs show the SQL so applications in other
//! languages can copy it.

pub mod sqlite;
