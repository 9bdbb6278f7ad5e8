//! How deeply a YAML text nests, found without parsing it (issue 32).
//!
//! serde_norway (libyaml's scanner, ported) takes time quadratic in the nesting of flow
//! collections (`{a: {a: …` 64,000 levels deep: 30 s) and reads a whole document into events
//! before its own recursion limit (128) refuses it. [`depth`] is one linear pass over the text
//! that follows libyaml's scanner closely enough to know where tokens start: the indentation
//! stack of block collections (`- `, `? `, `key:` at a deeper column, and a sequence under a key
//! at the key's own column), flow collections (`[`, `{`), and a `key: value` pair inside a flow
//! sequence (an implicit mapping). Scalars (plain, quoted, literal and folded blocks), comments,
//! anchors and tags are skipped as libyaml skips them, so brackets inside a string do not
//! count. Where it is unsure it counts more, never less: the count is at least the nesting of
//! the data serde_norway reads from the text (aliases are not expanded; serde_norway limits
//! those itself).

/// A block collection on libyaml's indentation stack.
struct Indent {
    column: usize,
    mapping: bool,
    /// A block sequence at this mapping's own column (`key:` then `- item` under it).
    indentless: bool,
}

/// A flow collection: a sequence, and whether its current entry is a `key: value` pair.
struct Flow {
    sequence: bool,
    pair: bool,
}

/// The simple key libyaml would use for the next `:` in block context.
#[derive(Clone, Copy)]
struct Key {
    column: usize,
    line: usize,
    offset: usize,
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    column: usize,
    line: usize,
    indents: Vec<Indent>,
    indentless: usize,
    flows: Vec<Flow>,
    pairs: usize,
    key: Option<Key>,
    key_allowed: bool,
    deepest: usize,
}

/// How many collections deep `text` nests at its deepest: block mappings and sequences, flow
/// mappings and sequences, and pairs in flow sequences. Stops as soon as the count passes
/// `stop_above` (and returns that count), so a deep document costs no more than a shallow one.
pub fn depth(text: &str, stop_above: usize) -> usize {
    let mut s = Scan {
        b: text.as_bytes(),
        i: 0,
        column: 0,
        line: 0,
        indents: Vec::new(),
        indentless: 0,
        flows: Vec::new(),
        pairs: 0,
        key: None,
        key_allowed: true,
        deepest: 0,
    };
    s.run(stop_above);
    s.deepest
}

/// The length of the UTF-8 sequence a leading byte starts (1 for a stray byte).
fn char_len(b: u8) -> usize {
    match b {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

impl Scan<'_> {
    fn at(&self, k: usize) -> u8 {
        self.b.get(self.i + k).copied().unwrap_or(0)
    }

    fn end(&self) -> bool {
        self.i >= self.b.len()
    }

    /// The length of the line break at `i + k` (`\r\n`, `\r`, `\n`, NEL, LS, PS), or 0.
    fn break_at(&self, k: usize) -> usize {
        match (self.at(k), self.at(k + 1), self.at(k + 2)) {
            (b'\r', b'\n', _) => 2,
            (b'\r' | b'\n', _, _) => 1,
            (0xc2, 0x85, _) => 2,
            (0xe2, 0x80, 0xa8 | 0xa9) => 3,
            _ => 0,
        }
    }

    fn blank_at(&self, k: usize) -> bool {
        matches!(self.at(k), b' ' | b'\t')
    }

    /// A blank, a line break or the end (libyaml's `IS_BLANKZ`; a NUL counts as the end).
    fn blankz_at(&self, k: usize) -> bool {
        self.blank_at(k) || self.break_at(k) > 0 || self.at(k) == 0
    }

    fn advance(&mut self) {
        if !self.end() {
            self.i += char_len(self.b[self.i]);
            self.column += 1;
        }
    }

    /// Consume the line break at `i`, if there is one.
    fn line_break(&mut self) -> bool {
        let n = self.break_at(0);
        if n > 0 {
            self.i += n;
            self.column = 0;
            self.line += 1;
        }
        n > 0
    }

    fn skip_to_break(&mut self) {
        while !self.end() && self.break_at(0) == 0 {
            self.advance();
        }
    }

    fn document_marker(&self) -> bool {
        self.column == 0
            && (self.b[self.i..].starts_with(b"---") || self.b[self.i..].starts_with(b"..."))
            && self.blankz_at(3)
    }

    fn current(&self) -> usize {
        self.indents.len() + self.indentless + self.flows.len() + self.pairs
    }

    /// Note the current depth; true once it passed `stop_above`.
    fn deeper(&mut self, stop_above: usize) -> bool {
        self.deepest = self.deepest.max(self.current());
        self.deepest > stop_above
    }

    /// libyaml's `roll_indent`: a block collection starts at `column` when that is deeper than
    /// the current one; a sequence at a mapping's own column is an indentless one.
    fn roll(&mut self, column: usize, mapping: bool) {
        match self.indents.last_mut() {
            Some(top) if top.column > column => {}
            Some(top) if top.column == column => {
                if !mapping && top.mapping && !top.indentless {
                    top.indentless = true;
                    self.indentless += 1;
                }
            }
            _ => self.indents.push(Indent { column, mapping, indentless: false }),
        }
    }

    /// libyaml's `unroll_indent`, and the end of an indentless sequence at a token of its
    /// column that is not `- `.
    fn unroll(&mut self, column: usize, entry: bool) {
        while self.indents.last().is_some_and(|t| t.column > column) {
            if self.indents.pop().is_some_and(|t| t.indentless) {
                self.indentless -= 1;
            }
        }
        if let Some(top) = self.indents.last_mut() {
            if top.column == column && top.indentless && !entry {
                top.indentless = false;
                self.indentless -= 1;
            }
        }
    }

    fn save_key(&mut self) {
        if self.flows.is_empty() && self.key_allowed {
            self.key = Some(Key { column: self.column, line: self.line, offset: self.i });
        }
    }

    fn remove_key(&mut self) {
        if self.flows.is_empty() {
            self.key = None;
        }
    }

    fn end_pair(&mut self) {
        if let Some(f) = self.flows.last_mut() {
            if std::mem::take(&mut f.pair) {
                self.pairs -= 1;
            }
        }
    }

    fn run(&mut self, stop_above: usize) {
        loop {
            self.skip_to_token();
            if self.end() {
                return;
            }
            let (c, column, start) = (self.at(0), self.column, self.i);
            let block = self.flows.is_empty();
            let entry = c == b'-' && self.blankz_at(1);
            if block {
                self.unroll(column, entry);
            }
            if column == 0 && c == b'%' {
                self.skip_to_break();
            } else if self.document_marker() {
                if block {
                    self.unroll_all();
                }
                self.remove_key();
                self.key_allowed = false;
                self.i += 3;
                self.column += 3;
            } else if c == b'[' || c == b'{' {
                self.save_key();
                self.flows.push(Flow { sequence: c == b'[', pair: false });
                self.key_allowed = true;
                self.advance();
                if self.deeper(stop_above) {
                    return;
                }
            } else if c == b']' || c == b'}' {
                self.remove_key();
                self.end_pair();
                self.flows.pop();
                self.key_allowed = false;
                self.advance();
            } else if c == b',' {
                self.remove_key();
                self.end_pair();
                self.key_allowed = true;
                self.advance();
            } else if entry {
                if block {
                    self.roll(column, false);
                }
                self.remove_key();
                self.key_allowed = true;
                self.advance();
            } else if (c == b'?' || c == b':') && (!block || self.blankz_at(1)) {
                if block {
                    // `:` belongs to the key saved on its line (within 1,024 bytes, as libyaml
                    // and serde_norway count), else it starts a mapping itself.
                    let key = self
                        .key
                        .take()
                        .filter(|k| c == b':' && k.line == self.line && k.offset.saturating_add(1024) >= self.i);
                    self.key_allowed = c == b'?' || key.is_none();
                    self.roll(key.map_or(column, |k| k.column), true);
                } else {
                    if let Some(f) = self.flows.last_mut() {
                        if f.sequence && !f.pair {
                            f.pair = true;
                            self.pairs += 1;
                        }
                    }
                    self.key_allowed = false;
                }
                self.advance();
                if self.deeper(stop_above) {
                    return;
                }
            } else if c == b'*' || c == b'&' {
                self.save_key();
                self.key_allowed = false;
                self.advance();
                while self.at(0).is_ascii_alphanumeric() || matches!(self.at(0), b'_' | b'-') {
                    self.advance();
                }
            } else if c == b'!' {
                self.save_key();
                self.key_allowed = false;
                self.tag();
            } else if (c == b'|' || c == b'>') && block {
                self.remove_key();
                self.key_allowed = true;
                self.block_scalar();
            } else if c == b'\'' || c == b'"' {
                self.save_key();
                self.key_allowed = false;
                self.quoted(c == b'\'');
            } else if b"|>%@`".contains(&c) {
                // No token starts here (libyaml stops with an error).
            } else {
                self.save_key();
                self.key_allowed = self.plain();
            }
            if self.i == start {
                // Always make progress, whatever the input.
                self.advance();
            }
            if block && self.deeper(stop_above) {
                return;
            }
        }
    }

    fn unroll_all(&mut self) {
        self.indents.clear();
        self.indentless = 0;
    }

    /// Blanks, comments and line breaks before the next token (a line break in block context
    /// allows a key again).
    fn skip_to_token(&mut self) {
        loop {
            if self.column == 0 && self.b[self.i..].starts_with("\u{feff}".as_bytes()) {
                self.advance();
            }
            while self.blank_at(0) {
                self.advance();
            }
            if self.at(0) == b'#' {
                self.skip_to_break();
            }
            if !self.line_break() {
                return;
            }
            if self.flows.is_empty() {
                self.key_allowed = true;
            }
        }
    }

    /// `!tag`, `!handle!suffix` or `!<verbatim>`: URI characters (a verbatim tag also takes
    /// `,`, `[` and `]`).
    fn tag(&mut self) {
        self.advance();
        let verbatim = self.at(0) == b'<';
        if verbatim {
            self.advance();
        }
        loop {
            let c = self.at(0);
            let uri =
                c.is_ascii_alphanumeric() || b"_-;/?:@&=+$.%!~*'()".contains(&c) || verbatim && b",[]".contains(&c);
            if !uri || c == 0 {
                break;
            }
            self.advance();
        }
        if verbatim && self.at(0) == b'>' {
            self.advance();
        }
    }

    /// A single- or double-quoted scalar, which may span lines.
    fn quoted(&mut self, single: bool) {
        self.advance();
        loop {
            // The end of the text, or a NUL (libyaml's end of the stream), ends it unclosed.
            if self.at(0) == 0 || self.document_marker() {
                return;
            }
            while !self.blankz_at(0) {
                let c = self.at(0);
                if single && c == b'\'' && self.at(1) == b'\'' {
                    self.advance();
                    self.advance();
                } else if (single && c == b'\'') || (!single && c == b'"') {
                    self.advance();
                    return;
                } else if !single && c == b'\\' {
                    self.advance();
                    if self.break_at(0) > 0 {
                        break;
                    }
                    self.advance();
                } else {
                    self.advance();
                }
            }
            while self.blank_at(0) || self.line_break() {
                if self.blank_at(0) {
                    self.advance();
                }
            }
        }
    }

    /// A plain scalar, which may go on over lines indented deeper than its collection (block
    /// context) or over any lines (flow context). Returns whether it ended after a line break
    /// (a key may start there).
    fn plain(&mut self) -> bool {
        let block = self.flows.is_empty();
        let indent = self.indents.last().map_or(0, |t| t.column + 1);
        let mut leading_break = false;
        loop {
            if self.document_marker() || self.at(0) == b'#' {
                break;
            }
            while !self.blankz_at(0) {
                let c = self.at(0);
                if c == b':' && (self.blankz_at(1) || !block && b",?[]{}".contains(&self.at(1))) {
                    break;
                }
                if !block && b",[]{}".contains(&c) {
                    break;
                }
                leading_break = false;
                self.advance();
            }
            if !(self.blank_at(0) || self.break_at(0) > 0) {
                break;
            }
            while self.blank_at(0) || self.break_at(0) > 0 {
                if self.line_break() {
                    leading_break = true;
                } else {
                    self.advance();
                }
            }
            if block && self.column < indent {
                break;
            }
        }
        leading_break
    }

    /// A literal (`|`) or folded (`>`) block scalar: its header, then the lines indented at
    /// least as deep as its first line (or its indentation indicator says).
    fn block_scalar(&mut self) {
        self.advance();
        let mut increment = 0;
        for _ in 0..2 {
            match self.at(0) {
                b'+' | b'-' => self.advance(),
                d @ b'1'..=b'9' => {
                    increment = usize::from(d - b'0');
                    self.advance();
                }
                _ => break,
            }
        }
        while self.blank_at(0) {
            self.advance();
        }
        if self.at(0) == b'#' {
            self.skip_to_break();
        }
        if !self.line_break() {
            // Not a valid header: libyaml stops here with an error.
            return;
        }
        let parent = self.indents.last().map(|t| t.column);
        let mut indent = match (increment, parent) {
            (0, _) => 0,
            (n, Some(p)) => p + n,
            (n, None) => n,
        };
        // Leading lines that hold only spaces; with no indicator the first other line sets the
        // indentation.
        let mut widest = 0;
        loop {
            while (indent == 0 || self.column < indent) && self.at(0) == b' ' {
                self.advance();
            }
            widest = widest.max(self.column);
            if (indent == 0 || self.column < indent) && self.at(0) == b'\t' {
                return;
            }
            if !self.line_break() {
                break;
            }
        }
        if indent == 0 {
            indent = widest.max(parent.map_or(0, |p| p + 1)).max(1);
        }
        while self.column == indent && !self.end() {
            self.skip_to_break();
            if !self.line_break() {
                return;
            }
            loop {
                while self.column < indent && self.at(0) == b' ' {
                    self.advance();
                }
                if self.column < indent && self.at(0) == b'\t' {
                    return;
                }
                if !self.line_break() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// The nesting of parsed data: a scalar 0, a collection one more than its deepest child.
    fn data_depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(data_depth).max().unwrap_or(0),
            Value::Object(m) => 1 + m.values().map(data_depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn should_count_what_the_parser_nests() {
        for (text, want) in [
            ("", 0),
            ("a\n", 0),
            ("a: b\n", 1),
            ("a:\n  b:\n    c: d\n", 3),
            ("a:\n- b\n- c: d\n", 3),
            ("a:\n- b:\n  - c:\n    - d\n", 6),
            ("- - - a\n", 3),
            ("- a: b\n  c:\n  - d\n", 3),
            ("a: [b, [c, {d: e}]]\n", 4),
            ("[a: [b: c]]\n", 4),
            ("{a: {b: {c: d}}}\n", 3),
            ("a: |\n  [[[[[[\n  {{{{\nb: '[[[['\nc: \"{{\\\"{{\"\nd: x[[[[y\n", 1),
            ("a: >-\n    - - - -\n    b: c: d\ne: 1\n", 1),
            ("a: b\n  [[[[ continued\n", 1),
            ("# [[[[[\na: b # {{{{\n", 1),
            ("a: !<tag:x,[y]> [b]\n", 2),
            ("&x a: *x\n", 1),
            ("---\na: [b]\n...\n---\n- - c\n", 2),
            ("? a\n: - b\n", 2),
            // A collection as a key: serde_norway refuses it (keys are strings), so it is
            // not counted as a mapping around the key.
            ("[a, b]: c\n", 1),
        ] {
            assert_eq!(depth(text, 1000), want, "{text:?}");
            if let Ok(v) = serde_norway::from_str::<Value>(text) {
                assert!(data_depth(&v) <= want, "{text:?}: the data nests {} deep", data_depth(&v));
            }
        }
    }

    #[test]
    fn should_stop_soon_after_the_limit() {
        let deep = "{a: ".repeat(64_000) + &"}".repeat(64_000);
        assert_eq!(depth(&deep, 64), 65);
        let deep = "[".repeat(1_000_000);
        assert_eq!(depth(&deep, 100), 101);
        let block: String = (0..200).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        assert_eq!(depth(&block, 64), 65);
        assert_eq!(depth(&"- ".repeat(1000), 64), 65);
    }

    /// Data with keys and strings that look like YAML syntax.
    fn data() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            prop::sample::select(vec![
                "a", "[", "]", "{", "}", "\"]\"", "'", "a: b", "- x", "? y", "#", "a #b", "x\ny", "\n[\n", " ]", "|",
                ">-", "&a", "*a", "!t", "---", "...", ",", "é", "\t[",
            ])
            .prop_map(String::from),
            "[\\[\\]{}:,'\" \n#a-]{0,6}",
        ];
        let leaf =
            prop_oneof![text.clone().prop_map(Value::String), any::<i32>().prop_map(Value::from), Just(Value::Null)];
        leaf.prop_recursive(12, 96, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((text.clone(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn should_count_at_least_the_nesting_of_any_data_in_any_style(v in data()) {
            let want = data_depth(&v);
            let texts = [
                crate::yaml::to_string(&v),
                serde_norway::to_string(&v).unwrap(),
                serde_json::to_string(&v).unwrap(),
                serde_json::to_string_pretty(&v).unwrap(),
            ];
            for text in texts {
                let back: Value = serde_norway::from_str(&text).unwrap();
                prop_assert_eq!(&back, &v, "{}", text);
                prop_assert!(depth(&text, usize::MAX) >= want, "{} < {want}:\n{text}", depth(&text, usize::MAX));
            }
        }
    }

    #[test]
    fn should_end_on_any_text() {
        // Found by the render_yaml fuzz target: a NUL inside a quoted scalar stopped the scan
        // making progress.
        let nul = format!("- \"x\\ny{}\\<<\"\n", "\0".repeat(97));
        for text in [
            nul.as_str(),
            "'\0",
            "\"\0\"",
            "\0",
            "[\0]",
            "|\n\0",
            "a: |\n  \0\n",
            "!\0",
            "&\0",
            "- \0: [\0",
            "\u{2028}\u{85}\r",
        ] {
            let (tx, rx) = std::sync::mpsc::channel();
            let owned = text.to_string();
            std::thread::spawn(move || tx.send(depth(&owned, usize::MAX)));
            let ended = rx.recv_timeout(std::time::Duration::from_secs(5));
            assert!(ended.is_ok(), "the scan of {text:?} did not end");
        }
    }

    proptest! {
        #[test]
        fn should_end_on_any_text_at_all(text in "[\\[\\]{}:,'\" \n\t#a|>!&*?\\\\\u{0}\u{85}\u{2028}-]{0,40}", any_text in any::<String>()) {
            depth(&text, usize::MAX);
            depth(&any_text, usize::MAX);
        }
    }

    #[test]
    fn should_never_count_less_than_the_data_nests() {
        // Shapes where a careless scan would under-count: brackets in a quoted string closing
        // real ones, a quote inside a plain scalar, sequences at their key's column.
        for text in [
            "[\"]\", [\"]\", [\"]\", [x]]]]\n",
            "[a'b, [[[c]]], d']\n",
            "[a\n'b, [[[c]]], d']\n",
            "{a: [\"}}}\", {b: [c]}]}\n",
            "a:\n- b:\n  - c:\n    - d:\n      - e\n",
            "a: 'x\n  ]]]]'\nb: [[[[c]]]]\n",
            "- \"\\\"]]\": [[[x]]]\n",
        ] {
            let v: Value = serde_norway::from_str(text).unwrap();
            assert!(depth(text, 1000) >= data_depth(&v), "{text:?}: {} < {}", depth(text, 1000), data_depth(&v));
        }
    }
}
