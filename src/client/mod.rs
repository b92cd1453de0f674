//! The Rust client: fenced session guards (being built; see issue 3).
