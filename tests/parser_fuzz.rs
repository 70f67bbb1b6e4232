//! Property tests: the DSL frontend never panics, whatever tokens it is given.
//!
//! (a) Random token sequences from a DSL-flavoured vocabulary, alone and
//!     wrapped in a variant skeleton (so that the tracer, not only the parser,
//!     sees them), go through `aec::frontend::parse_tokens`.
//! (b) Mutations of valid variant bodies (the `attention!` bodies of
//!     `examples/*.rs` plus a few built-in seeds): delete, duplicate, swap,
//!     replace or insert tokens; the result goes through
//!     `aec::frontend::parse_str`, and whatever parses is printed with
//!     `print::render` and `print::to_json`.
//!
//! (c) Random well-formed expressions (names bound or not, every function at
//!     right and wrong arities, booleans where numbers go and vice versa) in
//!     every closure position of both patterns, so that the tracer, its
//!     checks and the derived backward see far more than parse errors.
//!
//! Whenever a token stream parses, its `to_string()` must parse too: the
//! `attention!` macro stores that string and re-parses it at run time with an
//! `expect`.
//!
//! A panic anywhere fails the test (proptest catches it, shrinks the input and
//! reports the smallest one). Failures are not persisted to files.

use aec::frontend::{self, print};
use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use std::path::Path;

/// `cases` per property; `PROPTEST_CASES=n` in the environment overrides it
/// for longer runs.
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    }
}

/// Tokens the generators draw from: DSL keywords and names, literals of every
/// kind, and punctuation (multi-character operators included).
#[rustfmt::skip]
const VOCAB: &[&str] = &[
    // Structure and DSL keywords.
    "struct", "pub", "parallel", "recurrent", "paralel", "online", "state", "fwd", "epilogue",
    "State", "Scales", "modify_q", "modify_k", "modify_v", "modify_scores", "mask", "decay",
    "normalize", "let", "if", "else", "move", "fn", "self", "crate",
    // Names.
    "q", "k", "v", "s", "st", "o", "n", "m", "l", "x", "b", "h", "i", "j", "t", "d", "p", "bias",
    "lse", "_", "inf", "B", "H", "Hkv", "Sq", "Skv", "Dqk", "Dv", "S", "Dk",
    // Functions.
    "exp", "exp2", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "sign", "neg", "max",
    "min", "pow", "select", "where", "rowsum", "rowmax", "rowabssum", "expo",
    // Literals.
    "0", "1", "2", "7", "0.0", "0.5", "1.0", "2.5", "1e3", "1e400", "1e-400", "0x10", "3u8",
    "1.5f32", "99999999999999999999", "true", "false", "\"str\"", "'c'", "b\"x\"",
    // Punctuation.
    ":", ";", ",", "=", "|", "||", "+", "-", "*", "/", "%", "<", ">", "<=", ">=", "==", "!=", "!",
    "&", "&&", ".", "..", "->", "=>", "::", "#", "?", "@", "^", "'a",
    // Doc comments become `#[doc = …]` attributes.
    "/// doc\n",
];

/// One token tree as text: a vocabulary token or a delimited group.
fn tree() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(VOCAB).prop_map(str::to_string);
    leaf.prop_recursive(4, 96, 10, |inner| {
        (
            prop::sample::select(&["()", "[]", "{}"][..]),
            prop::collection::vec((inner, prop::sample::select(&[" ", "", "\n"][..])), 0..10),
        )
            .prop_map(|(delims, items)| {
                let body: String = items.into_iter().map(|(t, sep)| t + sep).collect();
                format!("{}{body}{}", &delims[..1], &delims[1..])
            })
    })
}

/// A sequence of token trees; separators may be empty, so punctuation can
/// join (`-` `>` → `->`) and identifiers can fuse.
fn soup(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(
        (tree(), prop::sample::select(&[" ", " ", "", "\n"][..])),
        0..max,
    )
    .prop_map(|items| items.into_iter().map(|(t, sep)| t + sep).collect())
}

const PARALLEL_DECLS: &str = "q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];";
const RECURRENT_DECLS: &str = "q: [B, H, S, Dk]; k: [B, H, S, Dk]; v: [B, H, S, Dv];";

/// Random text in a random position of a variant: raw, as the variant's
/// items, as a closure body, or inside the online block.
fn program() -> impl Strategy<Value = String> {
    prop_oneof![
        soup(40),
        soup(30).prop_map(|s| format!("pub struct X: parallel {{ {s} }}")),
        (
            prop::sample::select(
                &[
                    "modify_q = |q|",
                    "modify_k = |k, b, h, j|",
                    "modify_v = |v|",
                    "modify_scores = |s|",
                    "modify_scores = |s, b, h, i, j|",
                    "mask = |b, h, i, j|"
                ][..]
            ),
            soup(16),
        )
            .prop_map(|(head, s)| format!(
                "pub struct X: parallel {{ {PARALLEL_DECLS} bias: [H, Sq, Skv]; {head} {s} }}"
            )),
        (
            prop::sample::select(
                &[
                    "decay = |b, h, t|",
                    "decay = |b, h, t, d|",
                    "normalize = |o, n|",
                    "modify_k = |k, b, h, t|"
                ][..]
            ),
            soup(16),
        )
            .prop_map(|(head, s)| format!(
                "pub struct Y: recurrent {{ {RECURRENT_DECLS} g: [B, H, S]; {head} {s} }}"
            )),
        (soup(12), soup(16), soup(12)).prop_map(|(init, fwd, epi)| format!(
            "pub struct X: parallel {{ {PARALLEL_DECLS} online {{ state {{ m = -inf, l = {init} }} \
             fwd = |s, st| {fwd} epilogue = |o, st| {epi} }} }}"
        )),
        (soup(12), soup(12)).prop_map(|(p, alpha)| format!(
            "pub struct X: parallel {{ {PARALLEL_DECLS} online {{ state {{ m = -inf, l = 0.0 }} \
             fwd = |s, st| {{ let m = max(st.m, rowmax(s)); let p = exp(s - m); \
             ({p}, State {{ m, l: st.l * exp(st.m - m) + rowsum(p) }}, {alpha}) }} \
             epilogue = |o, st| (o / st.l, Scales {{ lse: st.m + log(st.l) }}) }} }}"
        )),
    ]
}

/// Parses, and for whatever parses also prints, serialises and re-parses.
fn exercise(tokens: TokenStream) -> Result<(), TestCaseError> {
    let text = tokens.to_string();
    if let Ok(v) = frontend::parse_tokens(tokens) {
        let rendered = print::render(&v);
        let json = print::to_json(&v);
        serde_json::to_string(&json).expect("the JSON serialises");
        // What the macro does at run time.
        match frontend::parse_str(&text) {
            Ok(again) => prop_assert_eq!(
                print::render(&again),
                rendered,
                "re-parsing the printed tokens gives another variant"
            ),
            Err(e) => {
                return Err(TestCaseError::fail(format!(
                    "the tokens parse but their to_string() does not: {e}\n{text}"
                )));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(768))]

    /// (a) Arbitrary token sequences never panic the parser or the tracer.
    #[test]
    fn token_soup_never_panics(src in program()) {
        let Ok(tokens) = src.parse::<TokenStream>() else {
            return Ok(()); // not tokenizable (e.g. `'a` followed by `'c'`): out of scope
        };
        exercise(tokens)?;
    }
}

/// A token tree with its groups opened up, so edits can reach any depth.
#[derive(Clone, Debug)]
enum Node {
    Leaf(TokenTree),
    Group(Delimiter, Vec<Node>),
}

fn to_nodes(tokens: TokenStream) -> Vec<Node> {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) if g.delimiter() != Delimiter::None => {
                Node::Group(g.delimiter(), to_nodes(g.stream()))
            }
            other => Node::Leaf(other),
        })
        .collect()
}

fn to_stream(nodes: &[Node]) -> TokenStream {
    nodes
        .iter()
        .map(|n| match n {
            Node::Leaf(tt) => tt.clone(),
            Node::Group(d, inner) => TokenTree::Group(Group::new(*d, to_stream(inner))),
        })
        .collect()
}

/// Number of nodes (leaves and groups), counted in preorder.
fn count(nodes: &[Node]) -> usize {
    nodes
        .iter()
        .map(|n| match n {
            Node::Leaf(_) => 1,
            Node::Group(_, inner) => 1 + count(inner),
        })
        .sum()
}

/// Calls `f(siblings, i)` for the node at preorder position `*target`.
fn at_node(
    nodes: &mut Vec<Node>,
    target: &mut usize,
    f: &mut dyn FnMut(&mut Vec<Node>, usize),
) -> bool {
    for i in 0..nodes.len() {
        if *target == 0 {
            f(nodes, i);
            return true;
        }
        *target -= 1;
        if let Node::Group(_, inner) = &mut nodes[i]
            && at_node(inner, target, f)
        {
            return true;
        }
    }
    false
}

fn leaves_mut<'a>(nodes: &'a mut [Node], out: &mut Vec<&'a mut TokenTree>) {
    for n in nodes {
        match n {
            Node::Leaf(tt) => out.push(tt),
            Node::Group(_, inner) => leaves_mut(inner, out),
        }
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete(Index),
    Duplicate(Index),
    Swap(Index, Index),
    Replace(Index, &'static str),
    Insert(Index, &'static str),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let vocab = || prop::sample::select(VOCAB);
    prop_oneof![
        any::<Index>().prop_map(Mutation::Delete),
        any::<Index>().prop_map(Mutation::Duplicate),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (any::<Index>(), vocab()).prop_map(|(a, t)| Mutation::Replace(a, t)),
        (any::<Index>(), vocab()).prop_map(|(a, t)| Mutation::Insert(a, t)),
    ]
}

fn vocab_nodes(token: &str) -> Vec<Node> {
    to_nodes(token.parse().expect("vocabulary tokens tokenize"))
}

fn apply(nodes: &mut Vec<Node>, m: &Mutation) {
    let total = count(nodes);
    if total == 0 {
        if let Mutation::Insert(_, t) | Mutation::Replace(_, t) = m {
            *nodes = vocab_nodes(t);
        }
        return;
    }
    let mut edit = |ix: &Index, f: &mut dyn FnMut(&mut Vec<Node>, usize)| {
        let mut target = ix.index(total);
        assert!(at_node(nodes, &mut target, f));
    };
    match m {
        Mutation::Delete(ix) => edit(ix, &mut |sib, i| {
            sib.remove(i);
        }),
        Mutation::Duplicate(ix) => edit(ix, &mut |sib, i| {
            let n = sib[i].clone();
            sib.insert(i, n);
        }),
        Mutation::Replace(ix, t) => edit(ix, &mut |sib, i| {
            sib.splice(i..=i, vocab_nodes(t));
        }),
        Mutation::Insert(ix, t) => edit(ix, &mut |sib, i| {
            sib.splice(i..i, vocab_nodes(t));
        }),
        Mutation::Swap(a, b) => {
            let mut leaves = Vec::new();
            leaves_mut(nodes, &mut leaves);
            if leaves.len() >= 2 {
                let (a, b) = (a.index(leaves.len()), b.index(leaves.len()));
                let tmp = leaves[a].clone();
                *leaves[a] = leaves[b].clone();
                *leaves[b] = tmp;
            }
        }
    }
}

/// Built-in valid variants, so the mutations cover both patterns, masks,
/// custom inputs and fixed sizes whatever `examples/` holds.
const SEEDS: &[&str] = &[
    r#"
    /// Softmax attention with a causal mask and a per-head bias.
    pub struct CausalBiased: parallel {
        q: [B, H, Sq, Dqk], k: [B, Hkv, Skv, Dqk], v: [B, Hkv, Skv, Dv = 8];
        bias: [H, Sq, Skv];
        modify_q = |q| q * rsqrt(Dqk);
        modify_scores = |s, b, h, i, j| s + bias - select(i >= j, 0.0, 1.0);
        mask = |b, h, i, j| i >= j && !(j > i + 100);
        online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = exp(s - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
        }
    }
    "#,
    r#"
    pub struct Relu: parallel {
        q: [B, H, Sq, Dqk], k: [B, H, Skv, Dqk], v: [B, H, Skv, Dv];
        modify_scores = |s| if s > 0.0 { pow(s, 2) / Skv } else { 0.0 };
    }
    "#,
    r#"
    /// Gated linear attention.
    pub struct Gla: recurrent {
        q: [B, H, S, Dk]; k: [B, H, S, Dk]; v: [B, H, S, Dv];
        g: [B, H, S, Dk];
        modify_k = |k, b, h, t| k * sigmoid(g);
        decay = |b, h, t, d| exp(-relu(g));
        normalize = |o, n| o / max(abs(n), 1.0);
    }
    "#,
];

/// The `attention! { … }` bodies in a Rust file, found on its token trees.
fn attention_bodies(tokens: TokenStream, out: &mut Vec<TokenStream>) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tt) in tts.iter().enumerate() {
        if let TokenTree::Group(g) = tt {
            let after_bang = i >= 2
                && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '!')
                && matches!(&tts[i - 2], TokenTree::Ident(id) if id == "attention");
            if after_bang && g.delimiter() == Delimiter::Brace {
                out.push(g.stream());
            } else {
                attention_bodies(g.stream(), out);
            }
        }
    }
}

/// Valid bodies to mutate: the built-in seeds and every variant in
/// `examples/*.rs` that parses (other files there are not this test's concern).
fn seeds() -> Vec<Vec<Node>> {
    let mut bodies: Vec<TokenStream> = SEEDS.iter().map(|s| s.parse().unwrap()).collect();
    for b in &bodies {
        if let Err(e) = frontend::parse_tokens(b.clone()) {
            panic!("a built-in seed does not parse: {e}\n{b}");
        }
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&examples)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut found = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let Ok(tokens) = text.parse::<TokenStream>() else {
            continue;
        };
        attention_bodies(tokens, &mut found);
    }
    bodies.extend(
        found
            .into_iter()
            .filter(|b| frontend::parse_str(&b.to_string()).is_ok()),
    );
    assert!(
        bodies.len() > SEEDS.len(),
        "expected valid variants in examples/ (softmax.rs)"
    );
    bodies.into_iter().map(to_nodes).collect()
}

proptest! {
    #![proptest_config(config(768))]

    /// (b) Mutated valid variants never panic the parser, tracer or printers.
    #[test]
    fn mutated_examples_never_panic(
        seed in any::<Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        thread_local! {
            static SEEDS: Vec<Vec<Node>> = seeds();
        }
        let mut nodes = SEEDS.with(|s| s[seed.index(s.len())].clone());
        for m in &mutations {
            apply(&mut nodes, m);
        }
        let text = to_stream(&nodes).to_string();
        match frontend::parse_str(&text) {
            Ok(v) => {
                print::render(&v);
                serde_json::to_string(&print::to_json(&v)).expect("the JSON serialises");
            }
            Err(d) => {
                // Errors must be renderable against the text they came from.
                d.render("body.rs", &text);
            }
        }
        // Swapping the halves of a lifetime (`'` `a`) can print text that
        // does not tokenize; `parse_str` has reported that above.
        if let Ok(tokens) = text.parse() {
            exercise(tokens)?;
        }
    }
}

/// The seeds themselves render, serialise and re-parse.
#[test]
fn seeds_round_trip() {
    for nodes in seeds() {
        let tokens = to_stream(&nodes);
        exercise(tokens.clone()).unwrap_or_else(|e| panic!("{e}\n{tokens}"));
    }
}

/// Names that are wrong in most closures: unbound, the state itself, fields
/// of non-states, axes of the other pattern.
const STRAYS: &[&str] = &[
    "x", "st", "st.x", "s.m", "st.0", "o", "n", "q", "bias", "g", "Hkv", "S", "Sq", "Dk", "inf",
    "true",
];
const LITERALS: &[&str] = &[
    "0", "1", "2", "-1", "0.0", "0.5", "1.0", "-2.5", "1e-3", "1e30", "1e400",
];
#[rustfmt::skip]
const CALLEES: &[&str] = &[
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "sign",
    "neg", "max", "min", "pow", "select", "where", "rowsum", "rowmax", "rowabssum", "expo",
];
const UNARY: &[&str] = &[
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "sign", "neg",
];
/// Row reductions: legal only in `fwd`.
const REDUCTIONS: &[&str] = &["rowsum", "rowmax", "rowabssum"];
const ARITHMETIC: &[&str] = &["+", "-", "*", "/"];
const COMPARISONS: &[&str] = &["<", "<=", ">", ">=", "==", "!="];

/// A number-valued and a boolean-valued expression of about the same depth.
type Pair = (String, String);

/// Either child's number, or (rarely) its boolean: a type error on purpose.
fn num(p: &Pair, wrong: bool) -> &str {
    if wrong { &p.1 } else { &p.0 }
}

/// A syntactically valid DSL expression over `names` (mostly) and the strays.
/// Built as well-typed number/boolean pairs so that most closures get past the
/// type checks into the tracer and the derived backward; type errors, stray
/// names and calls at wrong arities are mixed in at a low rate.
fn expr(names: &'static [&'static str]) -> impl Strategy<Value = String> {
    let num_leaf = prop_oneof![
        12 => prop::sample::select(names),
        1 => prop::sample::select(STRAYS),
        4 => prop::sample::select(LITERALS),
    ];
    let bool_leaf = prop_oneof![
        1 => prop::sample::select(&["true", "false"][..]).prop_map(str::to_string),
        3 => (
            prop::sample::select(names),
            prop::sample::select(COMPARISONS),
            prop::sample::select(LITERALS),
        )
            .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
    ];
    let leaf = (num_leaf.prop_map(str::to_string), bool_leaf);
    let pair = leaf.prop_recursive(5, 48, 3, |inner| {
        (
            inner.clone(),
            inner.clone(),
            inner,
            0..40u8,
            0..5u8,
            prop_oneof![12 => prop::sample::select(UNARY), 1 => prop::sample::select(REDUCTIONS)],
            prop::sample::select(ARITHMETIC),
            prop::sample::select(COMPARISONS),
            prop::sample::select(LITERALS),
            prop::sample::select(CALLEES),
            prop::bool::weighted(0.005),
        )
            .prop_map(|(a, b, c, nk, bk, f, arith, cmp, lit, callee, wrong)| {
                let (x, y) = (num(&a, wrong), num(&b, false));
                let n = match nk {
                    0..=9 => format!("{f}({x})"),
                    10..=21 => format!("({x} {arith} {y})"),
                    22..=24 => format!("max({x}, {y})"),
                    25..=26 => format!("min({x}, {y})"),
                    27..=29 => format!("pow({x}, {lit})"),
                    30..=31 => format!("-{x}"),
                    32..=33 => format!("select({}, {x}, {y})", a.1),
                    34..=35 => format!("if {} {{ {x} }} else {{ {y} }}", b.1),
                    36..=38 => format!("{{ let x = {x}; (x * {y}) }}"),
                    // Any callee with the children as arguments (arity may be
                    // wrong), or `%`, which the DSL does not have.
                    39 if wrong => format!("({x} % {y})"),
                    _ => format!("{callee}({x}, {y})"),
                };
                let bl = match bk {
                    0 | 1 => format!("({x} {cmp} {y})"),
                    2 => format!("({} && {})", a.1, b.1),
                    3 => format!("({} || {})", a.1, c.1),
                    _ => format!("!{}", a.1),
                };
                (n, bl)
            })
    });
    // Mostly numbers (masks take the boolean: see `closure`).
    pair.prop_map(|(n, _)| n)
}

/// A boolean-valued expression (for masks).
fn bool_expr(names: &'static [&'static str]) -> impl Strategy<Value = String> {
    (expr(names), expr(names), prop::sample::select(COMPARISONS))
        .prop_map(|(a, b, op)| format!("({a} {op} {b})"))
}

/// `head body;` with a random body over `names`, or nothing.
fn closure(head: &'static str, names: &'static [&'static str]) -> BoxedStrategy<String> {
    let body = if head.starts_with("mask") {
        bool_expr(names).boxed()
    } else {
        expr(names).boxed()
    };
    prop::option::weighted(0.5, body)
        .prop_map(move |b| b.map(|b| format!("{head} {b};\n")).unwrap_or_default())
        .boxed()
}

fn concat(parts: Vec<BoxedStrategy<String>>) -> impl Strategy<Value = String> {
    parts.prop_map(|p| p.concat())
}

/// A variant of either pattern whose closures hold random expressions.
fn traced_program() -> impl Strategy<Value = String> {
    const FWD: &[&str] = &["s", "st.m", "st.l", "m", "p", "Skv"];
    const EPI: &[&str] = &["o", "st.m", "st.l", "Dv"];
    let parallel = concat(vec![
        closure(
            "modify_q = |q, b, h, i|",
            &["q", "b", "h", "i", "w", "Dqk", "Sq"],
        ),
        closure("modify_k = |k, b, h, j|", &["k", "b", "h", "j", "w", "Skv"]),
        closure("modify_v = |v|", &["v", "w", "Dv"]),
        closure(
            "modify_scores = |s, b, h, i, j|",
            &["s", "b", "h", "i", "j", "bias", "w", "Skv"],
        ),
        closure("mask = |b, h, i, j|", &["b", "h", "i", "j", "bias", "Sq"]),
    ]);
    // The online block keeps the shape of a real one (a row maximum, a row
    // sum, a per-row rescale, an output scaled by the state) with random parts.
    const ROW: &[&str] = &["st.m", "st.l", "m", "Skv"];
    const STATE: &[&str] = &["st.m", "st.l", "Dv"];
    let online = (
        expr(&["inf", "Dqk", "1.0"]),
        expr(FWD),
        expr(FWD),
        expr(FWD),
        expr(ROW),
        prop_oneof![
            // Linear in `o`, as it must be, or anything (mostly rejected).
            3 => (prop::sample::select(&["*", "/"][..]), expr(STATE))
                .prop_map(|(op, scale)| format!("o {op} {scale}")),
            1 => expr(EPI),
        ],
        expr(STATE),
    )
        .prop_map(|(init, sm, p, w, alpha, out, lse)| {
            format!(
                "online {{ state {{ m = -inf, l = {init} }}\n\
                 fwd = |s, st| {{ let m = max(st.m, rowmax({sm})); let p = {p}; \
                 ({w}, State {{ m, l: st.l * {alpha} + rowsum(p) }}, {alpha}) }}\n\
                 epilogue = |o, st| ({out}, Scales {{ lse: {lse} }}) }}"
            )
        });
    let recurrent = concat(vec![
        closure("modify_q = |q|", &["q", "Dk"]),
        closure(
            "modify_k = |k, b, h, t|",
            &["k", "b", "h", "t", "g", "gate"],
        ),
        closure("modify_v = |v, b, h, t|", &["v", "t", "gate", "Dv"]),
        prop_oneof![
            closure("decay = |b, h, t|", &["b", "h", "t", "gate", "S"]),
            closure("decay = |b, h, t, d|", &["d", "t", "g", "gate"]),
        ]
        .boxed(),
        closure("normalize = |o, n|", &["o", "n", "Dv"]),
    ]);
    prop_oneof![
        (parallel, prop::option::of(online)).prop_map(|(items, online)| format!(
            "pub struct X: parallel {{\n{PARALLEL_DECLS}\nbias: [H, Sq, Skv]; w: [H];\n\
             {items}{}\n}}",
            online.unwrap_or_default()
        )),
        recurrent.prop_map(|items| format!(
            "pub struct Y: recurrent {{\n{RECURRENT_DECLS}\ng: [B, H, S, Dk]; gate: [B, H, S];\n\
             {items}\n}}"
        )),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// (c) Well-formed but arbitrary closures never panic the tracer, the
    /// derived backward or the printers.
    #[test]
    fn random_closures_never_panic(src in traced_program()) {
        let tokens: TokenStream = src.parse().expect("generated programs tokenize");
        exercise(tokens)?;
    }
}
