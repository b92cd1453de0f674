//! Storage-side fencing helpers (being built; see issue 3).
