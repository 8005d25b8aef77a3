//! What to say about a TOML syntax error. Every config format of stead
//! (the catalog, the control settings, the daemon's `stead.toml`) reports
//! syntax errors through here, so they read alike.

use toml::de::{DeTable, DeValue};

/// The 1-based line and column (in characters) of byte `offset` of
/// `contents`; an offset past the end or inside a character counts as the
/// end or that character's start.
pub fn position(contents: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(contents.len());
    while !contents.is_char_boundary(end) {
        end -= 1;
    }
    let before = &contents[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// toml's own message, which names the key or the expected token. toml
/// leaves a few errors without one (a carriage return without its line
/// feed, for one); then the character it stopped at and where, so an
/// error never ends in a blank.
pub fn message(error: &toml::de::Error, contents: &str) -> String {
    let message = error.message().trim();
    if !message.is_empty() {
        return message.to_owned();
    }
    let Some(span) = error.span() else {
        return "not valid TOML".to_owned();
    };
    let (line, column) = position(contents, span.start);
    match contents
        .get(span.start..)
        .and_then(|rest| rest.chars().next())
    {
        Some(c) => format!("unexpected character {c:?} at line {line}, column {column}"),
        None => format!("unexpected end of the file at line {line}, column {column}"),
    }
}

/// Where a toml error points and what it says, one line: `line L, column
/// C: KEY: MESSAGE` when the error has a position (the key is the one at
/// that position, as a dotted path), else toml's message alone.
pub fn describe(error: &toml::de::Error, contents: &str) -> String {
    let message = message(error, contents);
    match error.span() {
        Some(span) if !error.message().trim().is_empty() => {
            let (line, column) = position(contents, span.start);
            match key_at(contents, span.start) {
                Some(key) => format!("line {line}, column {column}: {key}: {message}"),
                None => format!("line {line}, column {column}: {message}"),
            }
        }
        _ => message,
    }
}

/// The 1-based line on which `path` (dotted keys with `[index]` suffixes,
/// as errors name fields: `types.wiki.services[0].ports[1]`) is written in
/// `contents`; `None` when the document does not parse or does not
/// contain it (a default value, or one set from elsewhere).
pub fn line_of(contents: &str, path: &str) -> Option<usize> {
    let root = DeValue::Table(DeTable::parse(contents).ok()?.into_inner());
    let mut node = &root;
    let mut span = None;
    for step in steps(path)? {
        let (next, at) = child(node, step)?;
        node = next;
        span = Some(at);
    }
    span.map(|s| position(contents, s.start).0)
}

/// The dotted path of the deepest key whose key or value covers byte
/// `offset` of `contents`; `None` when nothing does or it does not parse.
pub(crate) fn key_at(contents: &str, offset: usize) -> Option<String> {
    let root = DeValue::Table(DeTable::parse(contents).ok()?.into_inner());
    let mut path = String::new();
    deepest(&root, offset, &mut path, 0);
    (!path.is_empty()).then_some(path)
}

/// Longest path followed, against pathological nesting.
const DEPTH_MAX: usize = 32;

#[derive(Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[0][2].c` as keys and indexes; `None` for a malformed path.
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if key.is_empty() {
            return None;
        }
        out.push(Step::Key(key));
        while let Some(inner) = rest.strip_prefix('[') {
            let (index, after) = inner.split_once(']')?;
            out.push(Step::Index(index.parse().ok()?));
            rest = after;
        }
        if !rest.is_empty() || out.len() > DEPTH_MAX {
            return None;
        }
    }
    Some(out)
}

/// The child `step` names and the span to report for it: the key's for a
/// key, the element's for an index.
fn child<'v, 'i>(
    node: &'v DeValue<'i>,
    step: Step<'_>,
) -> Option<(&'v DeValue<'i>, std::ops::Range<usize>)> {
    match (node, step) {
        (DeValue::Table(t), Step::Key(k)) => {
            let (key, value) = t.get_key_value(k)?;
            Some((value.get_ref(), key.span()))
        }
        (DeValue::Array(a), Step::Index(i)) => {
            let element = a.get(i)?;
            Some((element.get_ref(), element.span()))
        }
        _ => None,
    }
}

/// Children as (path segment, key or element span, value span, child).
fn children<'v, 'i>(
    node: &'v DeValue<'i>,
) -> Vec<(
    String,
    std::ops::Range<usize>,
    std::ops::Range<usize>,
    &'v DeValue<'i>,
)> {
    match node {
        DeValue::Table(t) => t
            .iter()
            .map(|(k, v)| (k.get_ref().to_string(), k.span(), v.span(), v.get_ref()))
            .collect(),
        DeValue::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("[{i}]"), v.span(), v.span(), v.get_ref()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Appends to `path` the segments down to the deepest node covering
/// `offset`.
fn deepest(node: &DeValue<'_>, offset: usize, path: &mut String, depth: usize) {
    if depth > DEPTH_MAX {
        return;
    }
    for (segment, key_span, value_span, child) in children(node) {
        let covers = key_span.contains(&offset) || value_span.contains(&offset);
        // A table's span may be its header only; its keys may lie anywhere
        // below it, so look inside containers whatever their span says.
        let container = matches!(child, DeValue::Table(_) | DeValue::Array(_));
        if !(covers || container) {
            continue;
        }
        let before = path.len();
        if !segment.starts_with('[') && !path.is_empty() {
            path.push('.');
        }
        path.push_str(&segment);
        let mark = path.len();
        deepest(child, offset, path, depth + 1);
        if covers || path.len() > mark {
            return;
        }
        path.truncate(before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "workers = 2\n[recovery]\ndelays_s = [1, \"a\"]\n\n[[types.wiki.services]]\nname = \"web\"\n\n[[types.wiki.services]]\nname = \"api\"\nports = [80, 0]\n";

    #[test]
    fn a_field_path_resolves_to_the_line_it_is_written_on() {
        assert_eq!(line_of(DOC, "workers"), Some(1));
        assert_eq!(line_of(DOC, "recovery.delays_s"), Some(3));
        assert_eq!(line_of(DOC, "recovery.delays_s[1]"), Some(3));
        assert_eq!(line_of(DOC, "types.wiki.services[1].name"), Some(9));
        assert_eq!(line_of(DOC, "types.wiki.services[1].ports[1]"), Some(10));
        assert_eq!(line_of(DOC, "types.wiki.services[2].name"), None);
        assert_eq!(line_of(DOC, "absent"), None);
        assert_eq!(line_of(DOC, "bad[x"), None);
    }

    #[test]
    fn an_offset_resolves_to_the_key_written_there() {
        let at = |needle: &str| DOC.find(needle).unwrap();
        assert_eq!(key_at(DOC, at("2")).as_deref(), Some("workers"));
        assert_eq!(
            key_at(DOC, at("\"a\"")).as_deref(),
            Some("recovery.delays_s[1]")
        );
        assert_eq!(
            key_at(DOC, at("\"api\"")).as_deref(),
            Some("types.wiki.services[1].name")
        );
        assert_eq!(
            key_at(DOC, at("ports")).as_deref(),
            Some("types.wiki.services[1].ports")
        );
    }

    #[test]
    fn a_type_error_names_line_column_and_key() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Raw {
            workers: i64,
        }
        let text = "\nworkers = \"x\"\n";
        let error = toml::from_str::<Raw>(text).unwrap_err();
        assert_eq!(
            describe(&error, text),
            "line 2, column 11: workers: invalid type: string \"x\", expected i64"
        );
    }
}
