//! Single-flight fills: one upstream transfer per object, however many clients ask.
//!
//! A [`Fill`] owns a spool file and a detached task that writes the upstream body into it,
//! retrying and resuming on faults, and commits it to the store only once verified. Every
//! requester (the first included) is a reader of the growing spool: headers go out as soon as
//! the size is known, bytes as soon as they are written, a range as soon as its bytes are
//! there. A client that disconnects drops only its reader; the fill goes on.
//!
//! Full-body readers never receive the last byte before the object verified, so no client
//! gets a complete wrong body; a mismatch fails the fill (readers are cut short), counts it,
//! and starts over once from zero.
//!
//! - `registry`: [`Flights`], the registry of fills in progress, and [`Claim`]: join a fill
//!   or start one.
//! - `fill`: one [`Fill`] and the [`FillState`] its readers watch.
//! - `task`: the fill's owner task, from the shared bucket's plan to the outcome; the
//!   transfer with retry and resume in `transfer`, verify and commit in `commit`, and the
//!   chunks streamed to the shared bucket as they land in `upload`.
//! - `read`: readers of a fill's growing spool and of stored objects (bytes or file spans),
//!   with `pool`'s reusable buffers.
//!
//! Where a fill's bytes come from ([`Source`]) and how it checks them ([`Expect`]) are
//! [`crate::expect`]'s, below this module and the shared bucket alike.

mod commit;
mod fill;
mod pool;
mod read;
mod registry;
mod task;
mod transfer;
mod upload;

pub use crate::container::Container;
pub use crate::expect::{Expect, Opened, Source};
pub use fill::{Fill, FillState, Phase};
pub use read::{small_reads, stored_pieces, stored_reader, ObjectBody, Piece, MAX_PIECE};
pub use registry::{Claim, Flights};
