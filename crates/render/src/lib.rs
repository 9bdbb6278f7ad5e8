//! tender-render
