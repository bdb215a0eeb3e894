// Recursive-descent parser for the Jinja subset chat templates use, following Jinja2's own
// grammar and precedence (jinja2/parser.py): or < and < not < comparisons < + - < ~ < * / // %
// < ** < unary - + < postfix (. [] ()) and filters / tests.
#include "ast.h"
#include "lexer.h"

namespace strata::tokenizer::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, &end);
    if (!end.empty()) syntax_error(cur().line, "unexpected '" + end + "'");
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t ahead = 1) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  bool at_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool at_name(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  void expect_op(const char* op) {
    if (!at_op(op)) syntax_error(cur().line, std::string("expected '") + op + "'");
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) syntax_error(cur().line, "expected a name");
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) syntax_error(cur().line, "expected '%}'");
    ++i_;
  }

  // Statements until a block tag named in `ends` (consumed up to its name; *end gets the name), or
  // the end of input (*end empty).
  Body parse_body(std::initializer_list<const char*> ends, std::string* end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        end->clear();
        if (ends.size() != 0)
          syntax_error(t.line,
                       "unexpected end of template, expected '" + std::string(*ends.begin()) + "'");
        return body;
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::kText, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.type == Tok::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>(Stmt::Kind::kOutput, t.line);
        s->expr = parse_tuple_or_expr();
        if (cur().type != Tok::kVarEnd) syntax_error(cur().line, "expected '}}'");
        ++i_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& name = peek();
        if (name.type != Tok::kName) syntax_error(name.line, "expected a statement name");
        for (const char* e : ends) {
          if (name.text == e) {
            i_ += 2;
            *end = name.text;
            return body;
          }
        }
        i_ += 2;
        body.push_back(parse_statement(name.text, name.line));
      } else {
        syntax_error(t.line, "unexpected token");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement(const std::string& name, int line) {
    if (name == "if") return parse_if(line);
    if (name == "for") return parse_for(line);
    if (name == "set") return parse_set(line);
    if (name == "macro") return parse_macro(line);
    if (name == "call") return parse_call_block(line);
    if (name == "filter") return parse_filter_block(line);
    if (name == "break" || name == "continue") {
      expect_block_end();
      return std::make_unique<Stmt>(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue,
                                    line);
    }
    if (name == "generation") {
      // transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body;
      // we render it as an if-true block.
      expect_block_end();
      auto s = std::make_unique<Stmt>(Stmt::Kind::kIf, line);
      std::string end;
      Body body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      auto yes = std::make_unique<Expr>(Expr::Kind::kLiteral, line);
      yes->value = Value(true);
      s->branches.emplace_back(std::move(yes), std::move(body));
      return s;
    }
    syntax_error(line, "unknown or unsupported statement '" + name + "'");
  }

  std::unique_ptr<Stmt> parse_if(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kIf, line);
    ExprPtr cond = parse_tuple_or_expr();
    while (true) {
      expect_block_end();
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, &end);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple_or_expr();
        continue;
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &end);
      }
      expect_block_end();
      return s;
    }
  }

  Target parse_target(bool allow_attribute) {
    Target target;
    target.names.push_back(expect_name());
    if (allow_attribute && at_op(".")) {
      ++i_;
      target.attribute = expect_name();
      return target;
    }
    while (at_op(",")) {
      ++i_;
      target.is_tuple = true;
      if (cur().type != Tok::kName) break;
      target.names.push_back(expect_name());
    }
    return target;
  }

  std::unique_ptr<Stmt> parse_for(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kFor, line);
    const bool paren = at_op("(");
    if (paren) ++i_;
    s->target = parse_target(false);
    if (paren) expect_op(")");
    if (!at_name("in")) syntax_error(cur().line, "expected 'in'");
    ++i_;
    s->expr = parse_tuple_or_expr(/*with_condexpr=*/false);
    if (at_name("if")) {
      ++i_;
      s->filter = parse_expression();
    }
    if (at_name("recursive")) {
      ++i_;
      s->recursive = true;
    }
    expect_block_end();
    std::string end;
    s->body = parse_body({"else", "endfor"}, &end);
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_set(int line) {
    Target target = parse_target(true);
    if (at_op("=")) {
      ++i_;
      auto s = std::make_unique<Stmt>(Stmt::Kind::kSet, line);
      s->target = std::move(target);
      s->expr = parse_tuple_or_expr();
      expect_block_end();
      return s;
    }
    auto s = std::make_unique<Stmt>(Stmt::Kind::kSetBlock, line);
    s->target = std::move(target);
    if (at_op("|")) s->filter = parse_filter_chain(nullptr);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endset"}, &end);
    expect_block_end();
    return s;
  }

  void parse_params(Stmt* s) {
    expect_op("(");
    while (!at_op(")")) {
      std::string param = expect_name();
      ExprPtr default_value;
      if (at_op("=")) {
        ++i_;
        default_value = parse_expression();
      }
      s->params.emplace_back(std::move(param), std::move(default_value));
      if (!at_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  std::unique_ptr<Stmt> parse_macro(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kMacro, line);
    s->text = expect_name();
    parse_params(s.get());
    expect_block_end();
    std::string end;
    s->body = parse_body({"endmacro"}, &end);
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_call_block(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kCallBlock, line);
    if (at_op("(")) parse_params(s.get());
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::kCall) syntax_error(line, "expected a call");
    expect_block_end();
    std::string end;
    s->body = parse_body({"endcall"}, &end);
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_filter_block(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::kFilterBlock, line);
    --i_;  // parse_filter_chain expects to stand on a '|'-like position; reuse it from the name
    s->filter = parse_filter_chain(nullptr, /*first_without_pipe=*/true);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endfilter"}, &end);
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  ExprPtr make(Expr::Kind kind, int line) { return std::make_unique<Expr>(kind, line); }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::kBinary, a->line);
    e->name = std::move(op);
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_tuple_or_expr(bool with_condexpr = true) {
    const int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!at_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, line);
    tuple->children.push_back(std::move(first));
    while (at_op(",")) {
      ++i_;
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || at_op(")")) break;
      tuple->children.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      ++i_;
      auto cond = make(Expr::Kind::kCond, expr->line);
      cond->children.push_back(parse_or());
      cond->children.push_back(std::move(expr));
      if (at_name("else")) {
        ++i_;
        cond->children.push_back(parse_expression());
      } else {
        cond->children.push_back(nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      ++i_;
      left = binary("or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      ++i_;
      left = binary("and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      const int line = cur().line;
      ++i_;
      auto e = make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (at_name("in")) {
        op = "in";
        ++i_;
      } else if (at_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        return left;
      }
      left = binary(op, std::move(left), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      std::string op = t_[i_++].text;
      left = binary(op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      ++i_;
      left = binary("~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = t_[i_++].text;
      left = binary(op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      ++i_;
      left = binary("**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      auto e = make(Expr::Kind::kUnary, cur().line);
      e->name = t_[i_++].text;
      e->children.push_back(parse_unary(false));
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filters_and_tests(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      ++i_;
      auto e = make(Expr::Kind::kLiteral, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += t_[i_++].text;  // adjacent literals concatenate
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      ++i_;
      auto e = make(Expr::Kind::kLiteral, line);
      e->value = t.type == Tok::kInt ? Value(t.int_value) : Value(t.float_value);
      return e;
    }
    if (at_op("(")) {
      ++i_;
      if (at_op(")")) {
        ++i_;
        return make(Expr::Kind::kTuple, line);
      }
      ExprPtr inner = parse_expression();
      if (at_op(",")) {
        auto tuple = make(Expr::Kind::kTuple, line);
        tuple->children.push_back(std::move(inner));
        while (at_op(",")) {
          ++i_;
          if (at_op(")")) break;
          tuple->children.push_back(parse_expression());
        }
        inner = std::move(tuple);
      }
      expect_op(")");
      return inner;
    }
    if (at_op("[")) {
      ++i_;
      auto list = make(Expr::Kind::kList, line);
      while (!at_op("]")) {
        list->children.push_back(parse_expression());
        if (!at_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return list;
    }
    if (at_op("{")) {
      ++i_;
      auto dict = make(Expr::Kind::kDict, line);
      while (!at_op("}")) {
        dict->children.push_back(parse_expression());
        expect_op(":");
        dict->children.push_back(parse_expression());
        if (!at_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return dict;
    }
    syntax_error(
        line, t.type == Tok::kEof ? "unexpected end of template" : "unexpected '" + t.text + "'");
  }

  // Call arguments after '(' up to and including ')'.
  void parse_call_args(Expr* call) {
    expect_op("(");
    while (!at_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        call->keywords.push_back(t_[i_].text);
        i_ += 2;
        call->children.push_back(parse_expression());
      } else {
        if (!call->keywords.empty()) {
          syntax_error(cur().line, "positional argument after keyword argument");
        }
        call->children.push_back(parse_expression());
      }
      if (!at_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const int line = cur().line;
      if (at_op(".")) {
        ++i_;
        auto e = make(Expr::Kind::kAttr, line);
        if (cur().type == Tok::kInt) {  // foo.0 is foo[0]
          e->kind = Expr::Kind::kItem;
          auto index = make(Expr::Kind::kLiteral, line);
          index->value = Value(t_[i_++].int_value);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(index));
        } else {
          e->name = expect_name();
          e->children.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (at_op("[")) {
        ++i_;
        node = parse_subscript(std::move(node), line);
      } else if (at_op("(")) {
        auto call = make(Expr::Kind::kCall, line);
        call->children.push_back(std::move(node));
        parse_call_args(call.get());
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!at_op("]")) {
      if (at_op(":")) {
        is_slice = true;
        if (++part > 2) syntax_error(line, "too many ':' in a slice");
        ++i_;
        continue;
      }
      if (parts[part]) syntax_error(line, "expected ':' or ']'");
      parts[part] = parse_expression();
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) syntax_error(line, "empty subscript");
      auto e = make(Expr::Kind::kItem, line);
      e->children.push_back(std::move(target));
      e->children.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::kSlice, line);
    e->children.push_back(std::move(target));
    for (ExprPtr& p : parts) e->children.push_back(std::move(p));
    return e;
  }

  // `node | f(...) | g` filters; with `first_without_pipe`, the first name has no leading '|'
  // (a {% filter %} block). A null `node` is the block's body, filled in at render time.
  ExprPtr parse_filter_chain(ExprPtr node, bool first_without_pipe = false) {
    bool first = true;
    while (at_op("|") || (first && first_without_pipe)) {
      ++i_;
      first = false;
      auto f = make(Expr::Kind::kFilter, cur().line);
      f->name = expect_name();
      while (at_op(".")) {  // dotted filter names
        ++i_;
        f->name.append(".").append(expect_name());
      }
      f->children.push_back(std::move(node));
      if (at_op("(")) parse_call_args(f.get());
      node = std::move(f);
    }
    return node;
  }

  ExprPtr parse_filters_and_tests(ExprPtr node) {
    while (true) {
      if (at_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (at_name("is")) {
        ++i_;
        auto test = make(Expr::Kind::kTest, cur().line);
        if (at_name("not")) {
          ++i_;
          test->negated = true;
        }
        test->name = expect_name();
        test->children.push_back(std::move(node));
        if (at_op("(")) {
          parse_call_args(test.get());
        } else if (takes_bare_test_argument()) {
          test->children.push_back(parse_primary_with_postfix());
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  // Jinja2 accepts one argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
  bool takes_bare_test_argument() const {
    const Token& t = cur();
    if (t.type == Tok::kString || t.type == Tok::kInt || t.type == Tok::kFloat) return true;
    if (t.type == Tok::kOp) return t.text == "[" || t.text == "{" || t.text == "-";
    if (t.type != Tok::kName) return false;
    static const char* const kStop[] = {"else", "or", "and", "not", "in", "is", "if"};
    for (const char* s : kStop) {
      if (t.text == s) return false;
    }
    return true;
  }

  ExprPtr parse_primary_with_postfix() { return parse_postfix(parse_unary(false)); }

  std::vector<Token> t_;
  size_t i_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(lex_template(source)).parse(); }

}  // namespace strata::tokenizer::jinja
