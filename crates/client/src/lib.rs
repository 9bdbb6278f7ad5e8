//! The commands that are clients of a tender: they talk to a running one over HTTP (`--server`:
//! through its own endpoints, so its single-flight, verification and accounting apply), or work
//! in-process on a stopped one's data directory (`--data`: through the same fetch, store, catalog
//! and bundle code `tender serve` wires). Each command module holds its clap arguments and its
//! `run`; the binary parses and dispatches.
//!
//! - [`prefetch`] warms the cache; [`export`] writes prefetch's selection to a bundle (and,
//!   through `talos_cache`, as Talos' own image cache);
//!   [`import`] registers a bundle (and holds `bundle ls` and `tag rm`); [`bundlesig`] signs
//!   a bundle's index digest and checks that signature; [`inventory`] is `images`,
//!   `bundle rm` and `bundle diff`: what a site holds, and retiring a release.
//! - [`probe`] says whether a mirror is usable from here; [`stats`] reads the served statistics.
//! - [`maint`] is `fsck` and `gc`; [`catalog`] is `catalog sync`, `ls`, `rm`, `refs`, `trust`.
//! - [`http`]: the client options every command shares and the HTTP client they build.
//! - [`local`]: the config and data directory of a command, and the mirror over a store, built
//!   as `serve` builds it; [`datadir`]: how the data directory is checked and kept private
//!   (`serve` uses both).
//! - [`exit`]: the exit-code convention, and [`Failure`], the error every command returns.
//!
//! Must not depend on: anyhow (a [`Failure`] carries its exit class), the binary's logging
//! (this crate installs no subscriber; `catalog sync` asks its caller through
//! [`catalog::InitLogging`]). It serves nothing: of `tender-server` it uses only the served
//! statistics' type and the routing an import shares with a pull.

pub mod bundlesig;
pub mod catalog;
pub mod datadir;
pub mod exit;
pub mod export;
pub mod http;
pub mod import;
pub mod inventory;
pub mod local;
pub mod maint;
pub mod prefetch;
pub mod probe;
mod progress;
pub mod spec;
pub mod stats;
mod talos_cache;

pub use exit::{Class, Failure, Result};
pub use http::{ClientArgs, ClientOptions, TenderClient};
