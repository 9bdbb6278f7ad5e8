//! tender-fetch
