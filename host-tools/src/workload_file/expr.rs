//! Expressions: parsed from their text, then resolved against the names
//! in scope.

use device_runtime::abi::program::{
    OP_ADD, OP_DIV, OP_EQ, OP_LE, OP_LT, OP_MAX, OP_MIN, OP_MUL, OP_REM, OP_SUB,
};
use toml::Spanned;
use wsp_ffi::DTYPE_I32;

use super::raw::ExprSrc;
use super::resolve::Resolver;
use super::{ErrorKind, FileError};
use crate::table::TensorId;

/// A parsed expression; `usize`s are 0-based byte columns in its text.
#[derive(Clone, Debug)]
pub(super) enum Ast {
    Int(i64),
    Name(String, usize),
    Load(String, usize, Vec<Ast>),
    Bin(u8, Box<Ast>, Box<Ast>, usize),
    /// `a != b`, `a > b`, `a >= b` are rewritten; `-a` is `0 - a`.
    Ne(Box<Ast>, Box<Ast>, usize),
}

/// A resolved expression: names are slots of the enclosing scopes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum RExpr {
    Const(i64),
    Slot(usize),
    Symbol(u32),
    Load(TensorId, Vec<RExpr>),
    Bin(u8, Box<RExpr>, Box<RExpr>),
}

/// An expression error at a byte column of the expression text.
pub(super) struct ExprError {
    pub(super) column: usize,
    pub(super) kind: ErrorKind,
    pub(super) message: String,
}

pub(super) fn expr_err(column: usize, message: impl Into<String>) -> ExprError {
    ExprError {
        column,
        kind: ErrorKind::Expression,
        message: message.into(),
    }
}

/// Operations (`+`, `min`, `load`, comparisons, ...) one expression may
/// hold: expressions are resolved and dropped recursively, so a longer one
/// (`i + i + ...`, thousands of terms) would overflow the stack instead of
/// being refused.
pub(super) const MAX_EXPR_OPS: usize = 256;
/// How deep parentheses, function arguments and unary minus may nest, for
/// the same reason.
pub(super) const MAX_EXPR_NESTING: usize = 64;

pub(super) struct Parser<'a> {
    s: &'a [u8],
    pub(super) pos: usize,
    /// Operations parsed so far ([`MAX_EXPR_OPS`]).
    ops: usize,
    /// Nesting at the current position ([`MAX_EXPR_NESTING`]).
    nesting: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        Parser {
            s: text.as_bytes(),
            pos: 0,
            ops: 0,
            nesting: 0,
        }
    }

    /// Counts one more operation, at column `at`.
    fn op(&mut self, at: usize) -> Result<(), ExprError> {
        self.ops += 1;
        if self.ops > MAX_EXPR_OPS {
            let message = format!("expression too long: more than {MAX_EXPR_OPS} operations");
            return Err(expr_err(at, message));
        }
        Ok(())
    }

    /// `parse` one level deeper, at column `at`.
    fn nested<T>(
        &mut self,
        at: usize,
        parse: impl FnOnce(&mut Self) -> Result<T, ExprError>,
    ) -> Result<T, ExprError> {
        if self.nesting >= MAX_EXPR_NESTING {
            let message = format!("expression nested more than {MAX_EXPR_NESTING} deep");
            return Err(expr_err(at, message));
        }
        self.nesting += 1;
        let result = parse(self);
        self.nesting -= 1;
        result
    }

    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    pub(super) fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.pos).copied()
    }

    pub(super) fn eat(&mut self, token: &str) -> bool {
        self.ws();
        if self.s[self.pos..].starts_with(token.as_bytes()) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    pub(super) fn expect(&mut self, token: &str, what: &str) -> Result<(), ExprError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(expr_err(
                self.pos,
                format!("expected `{token}` {what}, found {}", self.found()),
            ))
        }
    }

    pub(super) fn found(&mut self) -> String {
        match self.peek() {
            None => "the end".to_string(),
            Some(_) => {
                let rest = String::from_utf8_lossy(&self.s[self.pos..]);
                let word: String = rest.chars().take(8).collect();
                format!("`{}`", word.trim_end())
            }
        }
    }

    pub(super) fn ident(&mut self) -> Option<(String, usize)> {
        self.ws();
        let start = self.pos;
        match self.s.get(self.pos) {
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {}
            _ => return None,
        }
        while self
            .s
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        {
            self.pos += 1;
        }
        let name = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        Some((name, start))
    }

    /// `sum (cmp sum)?`
    pub(super) fn expr(&mut self) -> Result<Ast, ExprError> {
        let a = self.sum()?;
        self.ws();
        let at = self.pos;
        let ops: [(&str, u8, bool); 4] = [
            ("<=", OP_LE, false),
            (">=", OP_LE, true),
            ("==", OP_EQ, false),
            ("!=", OP_EQ, false),
        ];
        for (token, op, swap) in ops {
            if self.eat(token) {
                self.op(at)?;
                let b = self.sum()?;
                return Ok(match (token, swap) {
                    ("!=", _) => Ast::Ne(Box::new(a), Box::new(b), at),
                    (_, true) => Ast::Bin(op, Box::new(b), Box::new(a), at),
                    _ => Ast::Bin(op, Box::new(a), Box::new(b), at),
                });
            }
        }
        if self.eat("<") {
            self.op(at)?;
            let b = self.sum()?;
            return Ok(Ast::Bin(OP_LT, Box::new(a), Box::new(b), at));
        }
        if self.eat(">") {
            self.op(at)?;
            let b = self.sum()?;
            return Ok(Ast::Bin(OP_LT, Box::new(b), Box::new(a), at));
        }
        Ok(a)
    }

    fn sum(&mut self) -> Result<Ast, ExprError> {
        let mut a = self.term()?;
        loop {
            self.ws();
            let at = self.pos;
            let op = if self.eat("+") {
                OP_ADD
            } else if self.eat("-") {
                OP_SUB
            } else {
                return Ok(a);
            };
            self.op(at)?;
            let b = self.term()?;
            a = Ast::Bin(op, Box::new(a), Box::new(b), at);
        }
    }

    fn term(&mut self) -> Result<Ast, ExprError> {
        let mut a = self.unary()?;
        loop {
            self.ws();
            let at = self.pos;
            let op = if self.eat("*") {
                OP_MUL
            } else if self.eat("/") {
                OP_DIV
            } else if self.eat("%") {
                OP_REM
            } else {
                return Ok(a);
            };
            self.op(at)?;
            let b = self.unary()?;
            a = Ast::Bin(op, Box::new(a), Box::new(b), at);
        }
    }

    fn unary(&mut self) -> Result<Ast, ExprError> {
        self.ws();
        let at = self.pos;
        if self.eat("-") {
            self.op(at)?;
            let a = self.nested(at, Self::unary)?;
            return Ok(Ast::Bin(OP_SUB, Box::new(Ast::Int(0)), Box::new(a), at));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Ast, ExprError> {
        let start = {
            self.ws();
            self.pos
        };
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                while self.s.get(self.pos).is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
                digits
                    .parse::<i64>()
                    .map(Ast::Int)
                    .map_err(|_| expr_err(start, format!("integer {digits} is too large")))
            }
            Some(b'(') => {
                self.pos += 1;
                let e = self.nested(start, Self::expr)?;
                self.expect(")", "to close `(`")?;
                Ok(e)
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let (name, at) = self.ident().unwrap_or_default();
                if !self.eat("(") {
                    return Ok(Ast::Name(name, at));
                }
                match name.as_str() {
                    "min" | "max" => {
                        self.op(at)?;
                        let a = self.nested(at, Self::expr)?;
                        self.expect(",", &format!("between the two arguments of {name}"))?;
                        let b = self.nested(at, Self::expr)?;
                        self.expect(")", &format!("after the two arguments of {name}"))?;
                        let op = if name == "min" { OP_MIN } else { OP_MAX };
                        Ok(Ast::Bin(op, Box::new(a), Box::new(b), at))
                    }
                    "load" => {
                        let Some((tensor, tat)) = self.ident() else {
                            return Err(expr_err(
                                self.pos,
                                "load needs a tensor name first: load(t, i, j)",
                            ));
                        };
                        self.op(at)?;
                        let mut index = Vec::new();
                        while self.eat(",") {
                            index.push(self.nested(at, Self::expr)?);
                        }
                        self.expect(")", "after the indices of load")?;
                        Ok(Ast::Load(tensor, tat, index))
                    }
                    _ => Err(expr_err(
                        at,
                        format!("unknown function `{name}` (functions: min, max, load)"),
                    )),
                }
            }
            _ => Err(expr_err(
                start,
                format!("expected a number, a name or `(`, found {}", self.found()),
            )),
        }
    }
}

/// Integer arithmetic as the device's program machine does it.
pub(super) fn arith(op: u8, a: i64, b: i64) -> Result<i64, &'static str> {
    if matches!(op, OP_DIV | OP_REM) && b == 0 {
        return Err("division by zero");
    }
    crate::program::arith(op, a, b).ok_or("arithmetic overflow")
}

impl Resolver<'_> {
    /// Resolves an expression written at byte `at` of the file.
    pub(super) fn expr(&mut self, src: &Spanned<ExprSrc>, what: &str) -> Result<RExpr, FileError> {
        let at = src.span().start;
        match src.get_ref() {
            ExprSrc::Int(v) => Ok(RExpr::Const(*v)),
            ExprSrc::Float(_) => Err(self.err(
                ErrorKind::Expression,
                at,
                format!("{what}: a float is only allowed as a kernel scalar"),
            )),
            ExprSrc::Text(text) => self.text_expr(text, at, what),
        }
    }

    pub(super) fn text_expr(
        &mut self,
        text: &str,
        at: usize,
        what: &str,
    ) -> Result<RExpr, FileError> {
        self.expr_base = at;
        let mut p = Parser::new(text);
        let parsed = p.expr().and_then(|ast| {
            if p.peek().is_some() {
                Err(expr_err(
                    p.pos,
                    format!("unexpected {} after the expression", p.found()),
                ))
            } else {
                Ok(ast)
            }
        });
        let resolved = parsed.and_then(|ast| self.resolve(&ast));
        resolved.map_err(|e| self.expr_error(text, at, what, e))
    }

    /// An [`ExprError`] of `text` (a string at byte `at`: its quote).
    pub(super) fn expr_error(&self, text: &str, at: usize, what: &str, e: ExprError) -> FileError {
        // A long expression is quoted by its first characters (the line and
        // column still point at the error).
        const QUOTED: usize = 80;
        let quoted = match text.char_indices().nth(QUOTED) {
            Some((cut, _)) => format!("{}...", &text[..cut]),
            None => text.to_string(),
        };
        self.err(
            e.kind,
            at + 1 + e.column,
            format!(
                "{what} \"{quoted}\", column {} of the expression: {}",
                e.column + 1,
                e.message
            ),
        )
    }

    pub(super) fn resolve(&mut self, ast: &Ast) -> Result<RExpr, ExprError> {
        Ok(match ast {
            Ast::Int(v) => RExpr::Const(*v),
            Ast::Name(name, col) => {
                if let Some(slot) = self.scope.iter().rposition(|e| e.name == *name) {
                    RExpr::Slot(slot)
                } else if let Some(s) = self.symbols.iter().position(|s| s.name == *name) {
                    RExpr::Symbol(s as u32)
                } else {
                    let in_scope: Vec<&str> = self
                        .scope
                        .iter()
                        .map(|e| e.name.as_str())
                        .chain(self.symbols.iter().map(|s| s.name.as_str()))
                        .filter(|n| !n.is_empty())
                        .collect();
                    let hint = if self.tensors.iter().any(|t| t.name == *name) {
                        format!("; `{name}` is a tensor: read an element with load({name}, ...)")
                    } else {
                        String::new()
                    };
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::UnknownName,
                        message: format!(
                            "unknown name `{name}` (in scope: {}){hint}",
                            if in_scope.is_empty() {
                                "nothing".to_string()
                            } else {
                                in_scope.join(", ")
                            }
                        ),
                    });
                }
            }
            Ast::Load(tensor, col, index) => {
                let Some(t) = self.tensors.iter().position(|t| t.name == *tensor) else {
                    let known: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::UnknownTensor,
                        message: format!(
                            "unknown tensor `{tensor}` (tensors: {})",
                            known.join(", ")
                        ),
                    });
                };
                let def = &self.tensors[t];
                if def.dtype != DTYPE_I32 {
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::Shape,
                        message: format!("load from `{tensor}`: only i32 tensors can be loaded"),
                    });
                }
                if index.len() != def.shape.len() {
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::Shape,
                        message: format!(
                            "load from `{tensor}`: {} indices for a rank-{} tensor",
                            index.len(),
                            def.shape.len()
                        ),
                    });
                }
                let index = index
                    .iter()
                    .map(|i| self.resolve(i))
                    .collect::<Result<_, _>>()?;
                self.loads
                    .push((TensorId(t as u32), self.expr_base + 1 + *col));
                RExpr::Load(TensorId(t as u32), index)
            }
            Ast::Bin(op, a, b, col) => {
                let (a, b) = (self.resolve(a)?, self.resolve(b)?);
                match (&a, &b) {
                    // Constant arithmetic is folded, as the device would compute it.
                    (RExpr::Const(x), RExpr::Const(y)) => {
                        RExpr::Const(arith(*op, *x, *y).map_err(|m| expr_err(*col, m))?)
                    }
                    _ => RExpr::Bin(*op, Box::new(a), Box::new(b)),
                }
            }
            Ast::Ne(a, b, col) => {
                let eq = Ast::Bin(OP_EQ, a.clone(), b.clone(), *col);
                let ne = Ast::Bin(OP_SUB, Box::new(Ast::Int(1)), Box::new(eq), *col);
                self.resolve(&ne)?
            }
        })
    }
}
