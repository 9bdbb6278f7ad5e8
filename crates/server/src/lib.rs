//! tender-server
