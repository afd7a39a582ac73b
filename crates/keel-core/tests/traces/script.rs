//! The trace file format, etcd's datadriven in miniature.
//!
//! A file is comment lines (`#`), blank lines and blocks. A block is one command line,
//! a `----` line, and the expected output up to the next blank line (or the file's end):
//!
//! ```text
//! # breaks-with: hard-state-unwaited
//! tick n1
//! ----
//! n1 -> n2 PreVote e0 last=0.0
//! ```
//!
//! Comments and blank lines are kept verbatim when a file is rewritten; only the
//! expected outputs change.

use std::collections::BTreeMap;

/// A part of a file, in order.
#[derive(Debug)]
pub enum Item {
    /// A comment or blank line, kept as it is.
    Text(String),
    /// A command with its expected output.
    Block(Block),
}

/// One command and what it is expected to print.
#[derive(Debug)]
pub struct Block {
    /// Where the command is (1-based), for messages.
    pub line: usize,
    /// The command line.
    pub command: String,
    /// The expected output, without its final newline.
    pub expected: String,
}

/// A parsed file.
#[derive(Debug)]
pub struct Script {
    pub items: Vec<Item>,
}

impl Script {
    pub fn parse(text: &str) -> Result<Script, String> {
        let mut items = Vec::new();
        let mut lines = text.lines().enumerate().peekable();
        while let Some((i, line)) = lines.next() {
            if line.trim().is_empty() || line.starts_with('#') {
                items.push(Item::Text(line.to_string()));
                continue;
            }
            match lines.next() {
                Some((_, "----")) => {}
                _ => return Err(format!("line {}: `----` must follow a command", i + 1)),
            }
            let mut expected = Vec::new();
            while let Some((_, out)) = lines.peek() {
                if out.trim().is_empty() {
                    break;
                }
                expected.push(out.to_string());
                lines.next();
            }
            let block =
                Block { line: i + 1, command: line.to_string(), expected: expected.join("\n") };
            items.push(Item::Block(block));
        }
        Ok(Script { items })
    }

    /// The value of a `# name: value` comment line, if the file has one.
    pub fn header(&self, name: &str) -> Option<String> {
        self.items.iter().find_map(|item| match item {
            Item::Text(t) => {
                let rest = t.strip_prefix('#')?.trim().strip_prefix(name)?;
                Some(rest.strip_prefix(':')?.trim().to_string())
            }
            Item::Block(_) => None,
        })
    }

    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.items.iter().filter_map(|i| match i {
            Item::Block(b) => Some(b),
            Item::Text(_) => None,
        })
    }

    /// The file again, each block's expected output replaced by `actual`'s (in order).
    pub fn render(&self, actual: &[String]) -> String {
        let mut out = String::new();
        let mut outputs = actual.iter();
        for item in &self.items {
            match item {
                Item::Text(t) => out.push_str(t),
                Item::Block(b) => {
                    let got = outputs.next().unwrap_or(&b.expected);
                    out.push_str(&format!("{}\n----\n{}", b.command, got));
                }
            }
            out.push('\n');
        }
        out
    }
}

/// A command line split into its name, its plain words and its `key=value` arguments.
#[derive(Debug)]
pub struct Cmd {
    pub name: String,
    pub words: Vec<String>,
    pub args: BTreeMap<String, String>,
}

impl Cmd {
    pub fn parse(line: &str) -> Cmd {
        let mut tokens = line.split_whitespace();
        let name = tokens.next().unwrap_or_default().to_string();
        let (mut words, mut args) = (Vec::new(), BTreeMap::new());
        for token in tokens {
            match token.split_once('=') {
                Some((k, v)) if !k.is_empty() => {
                    args.insert(k.to_string(), v.to_string());
                }
                _ => words.push(token.to_string()),
            }
        }
        Cmd { name, words, args }
    }

    /// The argument `key`, parsed, or `default`.
    pub fn arg<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, String> {
        match self.args.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("bad value for {key}: {v}")),
        }
    }

    /// The plain word at `i`.
    pub fn word(&self, i: usize) -> Result<&str, String> {
        self.words.get(i).map(String::as_str).ok_or_else(|| format!("{}: too few words", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_renders_back_unchanged_and_with_new_outputs() {
        let text = "# about\n# breaks-with: x\n\ntick n1\n----\na\nb\n\nstatus n1\n----\nok\n";
        let script = Script::parse(text).unwrap();
        assert_eq!(script.header("breaks-with").as_deref(), Some("x"));
        let expected: Vec<String> = script.blocks().map(|b| b.expected.clone()).collect();
        assert_eq!(expected, ["a\nb", "ok"]);
        assert_eq!(script.render(&expected), text);
        let changed = script.render(&["c".into(), "d".into()]);
        assert_eq!(
            changed,
            "# about\n# breaks-with: x\n\ntick n1\n----\nc\n\nstatus n1\n----\nd\n"
        );
        assert!(Script::parse("tick n1\nstatus\n").is_err());
    }

    #[test]
    fn commands_split_into_words_and_arguments() {
        let cmd = Cmd::parse("client n2 SET k v durability=memory");
        assert_eq!(cmd.name, "client");
        assert_eq!(cmd.words, ["n2", "SET", "k", "v"]);
        assert_eq!(cmd.args["durability"], "memory");
    }
}
