//! tender-oci
