//! Model cache and fetching.
