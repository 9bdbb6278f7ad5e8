//! tender-store
