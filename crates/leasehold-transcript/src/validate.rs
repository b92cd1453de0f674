//! A fast check that a message's text is JSON that a `serde_json::Value`
//! parse accepts, without building anything: most of what parsing a
//! transcript costs.
//!
//! It is conservative rather than complete: it accepts only text that
//! `Value` parsing certainly accepts, and answers "not sure" (`None`) for
//! everything else, including the rare valid shapes whose acceptance
//! depends on more than grammar: numbers with an exponent or hundreds of
//! digits (which may overflow to infinity, and `Value` refuses that),
//! `\u` escapes of surrogates (a lone one is refused), nesting deeper than
//! [`MAX_DEPTH`]. The caller then asks serde_json itself ([`Validated`]),
//! so the answer is always serde_json's; this only makes the common case
//! fast. A property test holds it to that.
//!
//! [`Validated`]: super::view::Validated

/// Deepest nesting accepted here; deeper text goes to serde_json, whose
/// limit ([`super::view::MAX_NESTING`]) is higher.
const MAX_DEPTH: u32 = 100;

/// Digits a number may have here: 300 cannot overflow an `f64`.
const MAX_DIGITS: usize = 300;

/// Checks the JSON value that starts at `at` in `text` (after any space);
/// its end when it is certainly one that `Value` parsing accepts, `None`
/// when it is not, or when that is not certain.
pub(crate) fn value_end(text: &str, at: usize) -> Option<usize> {
    let mut validator = Validator {
        bytes: text.as_bytes(),
        at,
    };
    validator.space();
    validator.value(0)?;
    Some(validator.at)
}

/// [`value_end`] for a whole text: one value, with only space around it.
pub(crate) fn is_one_value(text: &str) -> bool {
    let mut validator = Validator {
        bytes: text.as_bytes(),
        at: 0,
    };
    validator.space();
    if validator.value(0).is_none() {
        return false;
    }
    validator.space();
    validator.at == text.len()
}

struct Validator<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Validator<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?`, with at most [`MAX_DIGITS`] digits;
    /// an exponent is left to serde_json.
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            let before = self.at;
            self.digits();
            if self.at == before {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) || self.at - start > MAX_DIGITS {
            return None;
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
            self.at += 1;
        }
    }

    fn string(&mut self) -> Option<()> {
        self.at += 1;
        loop {
            self.at = special_byte(self.bytes, self.at);
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' => self.escape()?,
                // A control character, which JSON strings may not hold.
                _ => return None,
            }
        }
    }

    fn escape(&mut self) -> Option<()> {
        match *self.bytes.get(self.at + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
            b'u' => {
                let hex = self.bytes.get(self.at + 2..self.at + 6)?;
                let mut code = 0u32;
                for &digit in hex {
                    code = code * 16 + char::from(digit).to_digit(16)?;
                }
                // Surrogates are valid only in pairs: serde_json decides.
                if (0xD800..=0xDFFF).contains(&code) {
                    return None;
                }
                self.at += 6;
            }
            _ => return None,
        }
        Some(())
    }

    fn object(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.space();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            self.string()?;
            self.space();
            if self.peek()? != b':' {
                return None;
            }
            self.at += 1;
            self.space();
            self.value(depth)?;
            self.space();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.space();
                }
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.space();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.value(depth)?;
            self.space();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.space();
                }
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// The index of the first `"`, `\` or control character (below 0x20) at or
/// after `at` (or `bytes.len()`), eight bytes at a time.
fn special_byte(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * 0x20;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        // `(x - ONES * n) & !x` sets the high bit of the first byte of `x`
        // below `n` (n <= 0x80); bytes above it may be set spuriously, which
        // the lowest set bit ignores.
        let quotes = word ^ QUOTES;
        let backslashes = word ^ BACKSLASHES;
        let found = ((quotes.wrapping_sub(ONES) & !quotes)
            | (backslashes.wrapping_sub(ONES) & !backslashes)
            | (word.wrapping_sub(SPACES) & !word))
            & HIGHS;
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&byte) = bytes.get(at) {
        if byte == b'"' || byte == b'\\' || byte < 0x20 {
            return at;
        }
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn accepted_by_value(text: &str) -> bool {
        serde_json::from_str::<Value>(text).is_ok()
    }

    /// Ordinary JSON is accepted here (so the fast path is the one taken).
    #[test]
    fn ordinary_json_is_accepted() {
        for text in [
            r#"{"role":"user","content":[{"type":"text","text":"a\nb \"q\" \u00e9 \/"}]}"#,
            r#" [ 1 , -0 , 0.25 , -12.5 , true , false , null , {} , [ ] , "" ] "#,
            r#"{"a":{"b":{"c":[[[]]]}},"a":2}"#,
            "\"ünïcödé ✓\"",
        ] {
            assert!(is_one_value(text), "{text}");
            assert!(accepted_by_value(text), "{text}");
        }
    }

    /// What `Value` refuses is refused here, and what only serde_json can
    /// decide is left to it.
    #[test]
    fn doubtful_or_invalid_text_is_not_accepted() {
        for text in [
            "",
            "01",
            "1.",
            ".5",
            "+1",
            "-",
            "1e5",
            "1E-5",
            "tru",
            "nul",
            "[1,]",
            "{\"a\"}",
            "{\"a\":1,}",
            "{a:1}",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}b\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud83d\\ude00\"",
            "[1] [2]",
            "{\"a\":1}}",
            "'a'",
            "NaN",
        ] {
            assert!(!is_one_value(text), "{text:?}");
        }
        let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
        assert!(!is_one_value(&deep));
        let long = "9".repeat(MAX_DIGITS + 1);
        assert!(!is_one_value(&long));
    }

    /// Finds the first special byte at every position and alignment.
    #[test]
    fn special_byte_finds_the_first() {
        for length in 0..20 {
            for at in 0..length {
                for special in [b'"', b'\\', 0x00, 0x1f] {
                    let mut bytes = vec![0x7f; length];
                    bytes[at] = special;
                    for from in 0..=at {
                        assert_eq!(special_byte(&bytes, from), at);
                    }
                }
            }
            assert_eq!(special_byte(&vec![b' '; length], 0), length);
        }
    }

    /// JSON-like text: fragments that are, or are close to, JSON.
    fn jsonish() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            Just(" ".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\"k\"".to_string()),
            Just("\"\\n\\u00e9\\ud83d\\ude00\"".to_string()),
            Just("\\u".to_string()),
            Just("d800".to_string()),
            "[0-9.eE+-]{1,6}".prop_map(|s| s),
            Just("true".to_string()),
            Just("null".to_string()),
            Just("\u{1}".to_string()),
            Just("é".to_string()),
        ];
        prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    /// JSON-shaped text whose leaves are tricky: valid, invalid, or valid
    /// only as serde_json decides (exponents, surrogates, long numbers).
    fn tricky_tree() -> impl Strategy<Value = String> {
        let leaf = prop::sample::select(vec![
            "1e999",
            "-1E400",
            "1e-999",
            "2e3",
            "1.5",
            "-0",
            "0",
            "01",
            "1.",
            "-",
            "tru",
            "null",
            "\"\\ud800\"",
            "\"\\udc00x\"",
            "\"\\ud83d\\ude00\"",
            "\"\\u00e9\"",
            "\"a\u{1}\"",
            "\"\\x\"",
            "\"\\u12g4\"",
            "\"ok\"",
            "\"\u{7f}é\"",
        ])
        .prop_map(str::to_string)
        .boxed();
        let long = "9".repeat(400);
        let leaf = prop_oneof![8 => leaf, 1 => Just(long)];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(" , "))),
                prop::collection::vec(inner, 0..4).prop_map(|items| {
                    let fields: Vec<String> =
                        items.iter().map(|item| format!("\"k\":{item}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        })
    }

    /// A JSON value built by serde_json and written with random spacing.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..6)
                    .prop_map(|fields| Value::Object(fields.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Never accepts what `Value` parsing refuses.
        #[test]
        fn accepts_only_what_value_accepts(text in prop_oneof![jsonish(), tricky_tree()]) {
            if is_one_value(&text) {
                prop_assert!(accepted_by_value(&text), "{:?}", text);
            }
        }

        /// Accepts what serde_json writes, unless it holds an exponent or
        /// a surrogate escape (which serde_json does not write for text).
        #[test]
        fn accepts_what_serde_json_writes(value in json_value(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_string_pretty(&value)
            } else {
                serde_json::to_string(&value)
            }.unwrap_or_default();
            let doubtful = has_exponent(&text);
            prop_assert!(is_one_value(&text) || doubtful, "{}", text);
        }
    }

    /// True when a number outside strings in `text` has an exponent.
    fn has_exponent(text: &str) -> bool {
        let mut in_string = false;
        let mut escaped = false;
        let mut previous = b' ';
        for byte in text.bytes() {
            match (in_string, escaped, byte) {
                (true, true, _) => escaped = false,
                (true, false, b'\\') => escaped = true,
                (_, false, b'"') => in_string = !in_string,
                (false, _, b'e' | b'E') if previous.is_ascii_digit() || previous == b'.' => {
                    return true;
                }
                _ => {}
            }
            previous = byte;
        }
        false
    }
}
