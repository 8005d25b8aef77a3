//! Every example in `docs/configuration.md` parses (or, for the invalid
//! windows, is rejected), so the documentation cannot drift from the code.

use stead::core::catalog::Catalog;
use stead::core::grants::Grants;
use stead::core::window::Window;

const DOC: &str = include_str!("../docs/configuration.md");

/// The fenced blocks of `doc` whose info string is exactly `lang`.
fn blocks<'a>(doc: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = doc;
    while let Some(start) = rest.find(&fence) {
        let body = &rest[start + fence.len()..];
        let end = body.find("```").expect("unterminated code block");
        out.push(&body[..end]);
        rest = &body[end..][3..];
    }
    out
}

fn lines(block: &str) -> impl Iterator<Item = &str> {
    block.lines().map(str::trim).filter(|l| !l.is_empty())
}

#[test]
fn every_toml_example_in_the_configuration_doc_loads() {
    let toml_blocks = blocks(DOC, "toml");
    assert!(
        toml_blocks.len() >= 3,
        "expected catalog and control examples"
    );
    // A catalog example loads with the grants of the `stead.toml` example
    // shown before it, as the daemon would load it.
    let mut grants = Grants::default();
    for block in toml_blocks {
        if block.starts_with("# stead.toml") {
            // The daemon's own parser: what the doc shows is what it takes.
            let config = stead::config::daemon::parse(block, "docs/configuration.md", &[])
                .unwrap_or_else(|e| panic!("{e}\n{block}"));
            let defaults = stead::config::daemon::parse("", "defaults", &[]).unwrap();
            assert_eq!(
                config.control, defaults.control,
                "the doc shows the defaults"
            );
            grants = config.grants;
        } else {
            let catalog = Catalog::from_toml(block, "docs/configuration.md", &grants)
                .unwrap_or_else(|e| panic!("{e}\n{block}"));
            assert!(!catalog.is_empty());
        }
    }
}

/// The doc's notes example and the grants shown with it.
fn notes_example() -> (&'static str, Grants) {
    let toml_blocks = blocks(DOC, "toml");
    let catalog = toml_blocks
        .iter()
        .find(|b| b.contains("[types.notes]"))
        .expect("the notes example");
    let config = toml_blocks
        .iter()
        .find(|b| b.starts_with("# stead.toml") && b.contains("[grants]"))
        .expect("the grants of the notes example");
    let config = stead::config::daemon::parse(config, "stead.toml", &[]).unwrap();
    (catalog, config.grants)
}

#[test]
fn every_refusal_the_configuration_doc_shows_for_ungranted_access_is_what_stead_says() {
    let (catalog, grants) = notes_example();
    let shown: Vec<&str> = blocks(DOC, "text").into_iter().flat_map(lines).collect();
    for (from, to) in [
        ("\"/srv/stead/notes-seed\"", "\"/var/run/docker.sock\""),
        ("\"/etc/stead/secrets/notes-db\"", "\"/root/.kube/config\""),
        ("\"NOTES_DB_PASSWORD\"", "\"STEAD_DATABASE_URL\""),
    ] {
        assert!(catalog.contains(from), "{from} is not in the example");
        let asking = catalog.replacen(from, to, 1);
        let error = Catalog::from_toml(&asking, "catalog.toml", &grants)
            .expect_err("more than granted")
            .to_string();
        assert!(
            shown.contains(&error.as_str()),
            "the doc does not show what stead says:\n{error}"
        );
    }
}

#[test]
fn every_window_example_in_the_configuration_doc_parses_and_round_trips() {
    let specs: Vec<&str> = blocks(DOC, "window").into_iter().flat_map(lines).collect();
    assert!(specs.len() >= 5);
    for spec in specs {
        let window = Window::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(Window::parse(&window.to_string()), Ok(window), "{spec}");
    }
}

#[test]
fn every_invalid_window_example_in_the_configuration_doc_is_rejected() {
    let specs: Vec<&str> = blocks(DOC, "window-invalid")
        .into_iter()
        .flat_map(lines)
        .collect();
    assert!(specs.len() >= 5);
    for spec in specs {
        assert!(Window::parse(spec).is_err(), "{spec} should be rejected");
    }
}
