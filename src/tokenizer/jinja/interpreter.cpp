// Tree-walking evaluation of a parsed template (template.h) with Jinja2's scoping: a for loop's
// body gets a fresh scope per iteration (assignments do not leak out, hence namespace()), if
// blocks share their enclosing scope, macros see the globals and the template's top-level
// variables plus their own.
#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "ast.h"
#include "builtins.h"
#include "strata/common/check.h"
#include "strings.h"
#include "template.h"

namespace strata::tokenizer::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

// Python floor division and modulo for ints.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

class Interpreter {
 public:
  Interpreter(std::shared_ptr<Dict> globals, std::shared_ptr<Dict> root)
      : scopes_{std::move(globals), std::move(root)} {}

  Flow render(const Body& body, TString* out) {
    for (const auto& stmt : body) {
      const Flow flow = render(*stmt, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Flow render(const Stmt& s, TString* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out->append(s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out->append(to_tstring(eval(*s.expr)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond).truthy()) return render(body, out);
        }
        return render(s.else_body, out);
      case Stmt::Kind::kFor:
        render_for(s, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        assign(s.target, eval(*s.expr), s.line);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        TString captured;
        render(s.body, &captured);
        Value v(std::move(captured));
        if (s.filter) v = eval_filter(*s.filter, &v);
        assign(s.target, std::move(v), s.line);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scopes_.back()->set(s.text, make_macro(s, nullptr));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock:
        out->append(to_tstring(eval_call(*s.expr, &s)));
        return Flow::kNormal;
      case Stmt::Kind::kFilterBlock: {
        TString captured;
        render(s.body, &captured);
        Value v(std::move(captured));
        out->append(to_tstring(eval_filter(*s.filter, &v)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void render_for(const Stmt& s, TString* out) {
    if (s.recursive) throw TemplateError("recursive for loops are not supported");
    const Value iterable = eval(*s.expr);
    Args no_args;
    List items = apply_filter("list", iterable, no_args).as_list();
    if (s.filter) {
      List kept;
      for (const Value& item : items) {
        scopes_.push_back(std::make_shared<Dict>());
        bind(s.target, item, s.line);
        const bool keep = eval(*s.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      render(s.else_body, out);
      return;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto scope = std::make_shared<Dict>();
      scopes_.push_back(scope);
      bind(s.target, items[static_cast<size_t>(i)], s.line);
      scope->set("loop", loop_object(items, i));
      const Flow flow = render(s.body, out);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
  }

  static Value loop_object(const List& items, int64_t i) {
    const auto n = static_cast<int64_t>(items.size());
    auto loop = std::make_shared<Dict>();
    loop->set("index0", Value(i));
    loop->set("index", Value(i + 1));
    loop->set("revindex0", Value(n - i - 1));
    loop->set("revindex", Value(n - i));
    loop->set("first", Value(i == 0));
    loop->set("last", Value(i == n - 1));
    loop->set("length", Value(n));
    loop->set("depth", Value(int64_t{1}));
    loop->set("depth0", Value(int64_t{0}));
    loop->set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("previtem"));
    loop->set("nextitem",
              i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("nextitem"));
    loop->set("cycle", Value::callable("cycle", [i](Args& a) {
                if (a.positional.empty()) throw TemplateError("no items for cycling given");
                return a.positional[static_cast<size_t>(i) % a.positional.size()];
              }));
    return Value::dict(std::move(loop));
  }

  // Binds a loop target in the innermost scope.
  void bind(const Target& target, const Value& value, int line) {
    if (!target.is_tuple) {
      scopes_.back()->set(target.names[0], value);
      return;
    }
    if (!value.is_list() || value.as_list().size() != target.names.size()) {
      throw TemplateError("line " + std::to_string(line) + ": cannot unpack " + type_name(value) +
                          " into " + std::to_string(target.names.size()) + " names");
    }
    for (size_t k = 0; k < target.names.size(); ++k) {
      scopes_.back()->set(target.names[k], value.as_list()[k]);
    }
  }

  void assign(const Target& target, Value value, int line) {
    if (target.attribute.empty()) {
      bind(target, value, line);
      return;
    }
    Value object = lookup(target.names[0]);
    if (!object.is_dict() || !object.as_dict().is_namespace) {
      throw TemplateError("line " + std::to_string(line) +
                          ": can only assign attributes of a namespace()");
    }
    if (!target.attribute.empty() && target.attribute[0] == '_') {
      throw TemplateError(
          "Chat templates cannot store underscore-prefixed attributes on a namespace");
    }
    object.mutable_dict().set(target.attribute, std::move(value));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (const Value* v = (*it)->find(name)) return *v;
    }
    return Value::undefined(name);
  }

  // The scopes a macro or caller() sees, held weakly: the macro is stored in them, and a strong
  // reference would make a cycle that outlives the render (a leak per rendered prompt). The
  // interpreter holds them for as long as anything can call the macro.
  using ScopeRefs = std::vector<std::weak_ptr<Dict>>;
  static std::vector<std::shared_ptr<Dict>> lock_scopes(const ScopeRefs& refs) {
    std::vector<std::shared_ptr<Dict>> scopes;
    for (const auto& ref : refs) {
      scopes.push_back(ref.lock());
      STRATA_CHECK(scopes.back() != nullptr) << "a macro called after its render ended";
    }
    return scopes;
  }

  // A macro as a callable; `call_block` is the {% call %} statement whose body `caller()` renders.
  Value make_macro(const Stmt& macro, const Stmt* call_block) {
    const ScopeRefs definition{scopes_[0], scopes_[1]};  // globals and the template's root
    const Stmt* m = &macro;
    return Value::callable(macro.text, [this, m, call_block, definition](Args& args) {
      auto scope = std::make_shared<Dict>();
      std::vector<std::shared_ptr<Dict>> scopes = lock_scopes(definition);
      scopes.push_back(scope);
      std::vector<std::shared_ptr<Dict>> saved = std::exchange(scopes_, std::move(scopes));
      try {
        List varargs;
        for (size_t k = 0; k < m->params.size(); ++k) {
          Value v = args.take(k, m->params[k].first);
          if (v.is_undefined() && m->params[k].second) v = eval(*m->params[k].second);
          scope->set(m->params[k].first, v);
        }
        for (size_t k = m->params.size(); k < args.positional.size(); ++k) {
          varargs.push_back(args.positional[k]);
        }
        auto kwargs = std::make_shared<Dict>();
        for (const auto& keyword : args.keyword) {
          const bool is_param =
              std::any_of(m->params.begin(), m->params.end(),
                          [&](const auto& p) { return p.first == keyword.first; });
          if (!is_param) kwargs->set(keyword.first, keyword.second);
        }
        scope->set("varargs", Value::list(std::move(varargs), true));
        scope->set("kwargs", Value::dict(std::move(kwargs)));
        if (call_block) {
          scope->set("caller", make_caller(*call_block, ScopeRefs(saved.begin(), saved.end())));
        }
        TString out;
        render(m->body, &out);
        scopes_ = std::move(saved);
        return Value(std::move(out));
      } catch (...) {
        scopes_ = std::move(saved);
        throw;
      }
    });
  }

  // caller() of a {% call %} block: renders its body in the scopes where the call was written.
  Value make_caller(const Stmt& call_block, ScopeRefs call_scopes) {
    const Stmt* c = &call_block;
    return Value::callable("caller", [this, c, call_scopes](Args& args) {
      auto scope = std::make_shared<Dict>();
      for (size_t k = 0; k < c->params.size(); ++k) {
        Value v = args.take(k, c->params[k].first);
        scope->set(c->params[k].first, v);
      }
      std::vector<std::shared_ptr<Dict>> scopes = lock_scopes(call_scopes);
      scopes.push_back(scope);
      std::vector<std::shared_ptr<Dict>> saved = std::exchange(scopes_, std::move(scopes));
      TString out;
      try {
        render(c->body, &out);
      } catch (...) {
        scopes_ = std::move(saved);
        throw;
      }
      scopes_ = std::move(saved);
      return Value(std::move(out));
    });
  }

  // ---- expressions ----

  Args eval_args(const Expr& e, size_t first) {
    Args args;
    const size_t n_keyword = e.keywords.size();
    const size_t n_positional = e.children.size() - first - n_keyword;
    for (size_t k = 0; k < n_positional; ++k)
      args.positional.push_back(eval(*e.children[first + k]));
    for (size_t k = 0; k < n_keyword; ++k) {
      args.keyword.emplace_back(e.keywords[k], eval(*e.children[first + n_positional + k]));
    }
    return args;
  }

  Value eval_call(const Expr& e, const Stmt* call_block) {
    Value callee = eval(*e.children[0]);
    if (call_block) {
      // {% call macro(...) %}: re-bind the macro with this block as its caller.
      const Stmt* macro = find_macro_statement(callee);
      if (!macro) throw TemplateError("{% call %} needs a macro");
      callee = make_macro(*macro, call_block);
    }
    if (!callee.is_callable()) {
      if (callee.is_undefined()) {
        throw TemplateError("line " + std::to_string(e.line) + ": '" + callee.name() +
                            "' is undefined");
      }
      throw TemplateError("line " + std::to_string(e.line) + ": '" + type_name(callee) +
                          "' object is not callable");
    }
    Args args = eval_args(e, 1);
    return callee.as_callable()(args);
  }

  const Stmt* find_macro_statement(const Value& callee) const {
    auto it = macros_by_name_.find(callee.name());
    return it == macros_by_name_.end() ? nullptr : it->second;
  }

  Value eval_filter(const Expr& e, const Value* block_input) {
    const Value input = e.children[0] ? eval(*e.children[0]) : *block_input;
    Args args = eval_args(e, 1);
    return apply_filter(e.name, input, args);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& c : e.children) items.push_back(eval(*c));
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
          const Value key = eval(*e.children[k]);
          if (!key.is_string()) throw TemplateError("only string dict keys are supported");
          d->set(key.as_string(), eval(*e.children[k + 1]));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kAttr:
        return with_line(e, [&] { return get_attribute(eval(*e.children[0]), e.name); });
      case Expr::Kind::kItem:
        return with_line(e, [&] { return get_item(eval(*e.children[0]), eval(*e.children[1])); });
      case Expr::Kind::kSlice: {
        auto part = [&](size_t k) { return e.children[k] ? eval(*e.children[k]) : Value(); };
        return get_slice(eval(*e.children[0]), part(1), part(2), part(3));
      }
      case Expr::Kind::kCall:
        return eval_call(e, nullptr);
      case Expr::Kind::kFilter:
        return with_line(e, [&] { return eval_filter(e, nullptr); });
      case Expr::Kind::kTest: {
        const Value subject = eval(*e.children[0]);
        Args args = eval_args(e, 1);
        return Value(apply_test(e.name, subject, args) != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.children[0]);
        if (e.name == "not") return Value(!v.truthy());
        if (e.name == "-") return v.is_int() ? Value(-v.as_int()) : Value(-v.as_number());
        return v;
      }
      case Expr::Kind::kBinary:
        return with_line(e, [&] { return eval_binary(e); });
      case Expr::Kind::kCond:
        if (eval(*e.children[0]).truthy()) return eval(*e.children[1]);
        return e.children[2] ? eval(*e.children[2]) : Value::undefined();
    }
    return Value();
  }

  template <typename F>
  Value with_line(const Expr& e, F&& f) {
    try {
      return f();
    } catch (const TemplateError& error) {
      const std::string what = error.what();
      if (what.rfind("line ", 0) == 0 || what.rfind("raise_exception", 0) == 0) throw;
      throw TemplateError("line " + std::to_string(e.line) + ": " + what);
    }
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.children[0]);
      return a.truthy() ? eval(*e.children[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.children[0]);
      return a.truthy() ? a : eval(*e.children[1]);
    }
    const Value a = eval(*e.children[0]);
    const Value b = eval(*e.children[1]);
    if (op == "~") {
      TString s = to_tstring(a);
      s.append(to_tstring(b));
      return Value(std::move(s));
    }
    if (op == "==") return Value(equals(a, b));
    if (op == "!=") return Value(!equals(a, b));
    if (op == "<") return Value(compare(a, b) < 0);
    if (op == "<=") return Value(compare(a, b) <= 0);
    if (op == ">") return Value(compare(a, b) > 0);
    if (op == ">=") return Value(compare(a, b) >= 0);
    if (op == "in") return Value(contains(b, a));
    if (op == "notin") return Value(!contains(b, a));
    return arithmetic(op, a, b);
  }

  static Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (op == "+" && a.is_string() && b.is_string()) {
      TString s = a.as_tstring();
      s.append(b.as_tstring());
      return Value(std::move(s));
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      List items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.is_int()) {
      if (a.is_string()) {
        TString s;
        for (int64_t k = 0; k < b.as_int(); ++k) s.append(a.as_tstring());
        return Value(std::move(s));
      }
      List items;
      for (int64_t k = 0; k < b.as_int(); ++k) {
        items.insert(items.end(), a.as_list().begin(), a.as_list().end());
      }
      return Value::list(std::move(items));
    }
    if (op == "%" && a.is_string()) return Value(percent_format(a.as_tstring(), b));
    const bool numbers = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
    if (!numbers) {
      throw TemplateError(std::string("unsupported operand type(s) for ") + op + ": '" +
                          type_name(a) + "' and '" + type_name(b) + "'");
    }
    const bool ints = !a.is_float() && !b.is_float();
    const int64_t x = ints ? static_cast<int64_t>(a.as_number()) : 0;
    const int64_t y = ints ? static_cast<int64_t>(b.as_number()) : 0;
    const double fx = a.as_number();
    const double fy = b.as_number();
    if (op == "+") return ints ? Value(x + y) : Value(fx + fy);
    if (op == "-") return ints ? Value(x - y) : Value(fx - fy);
    if (op == "*") return ints ? Value(x * y) : Value(fx * fy);
    if ((op == "/" || op == "//" || op == "%") && fy == 0) {
      throw TemplateError("division by zero");
    }
    if (op == "/") return Value(fx / fy);
    if (op == "//") return ints ? Value(floor_div(x, y)) : Value(std::floor(fx / fy));
    if (op == "%") {
      if (ints) return Value(x - floor_div(x, y) * y);
      return Value(fx - std::floor(fx / fy) * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < y; ++k) r *= x;
        return Value(r);
      }
      return Value(std::pow(fx, fy));
    }
    throw TemplateError("unknown operator " + op);
  }

 public:
  // Records every macro statement by name so {% call %} can re-bind it with a caller.
  void index_macros(const Body& body) {
    for (const auto& s : body) {
      if (s->kind == Stmt::Kind::kMacro) macros_by_name_[s->text] = s.get();
      index_macros(s->body);
      index_macros(s->else_body);
      for (const auto& [cond, branch] : s->branches) index_macros(branch);
    }
  }

 private:
  std::vector<std::shared_ptr<Dict>> scopes_;  // [globals, template root, inner scopes...]
  std::unordered_map<std::string, const Stmt*> macros_by_name_;
};

}  // namespace

StatusOr<Template> Template::parse(std::string_view source) {
  try {
    Template t;
    t.body_ = std::make_shared<const Body>(parse_template(source));
    return t;
  } catch (const TemplateError& error) {
    return invalid_argument_error(std::string("chat template: ") + error.what());
  }
}

StatusOr<TString> Template::render(const std::vector<std::pair<std::string, Value>>& variables,
                                   std::time_t now) const {
  try {
    auto globals = std::make_shared<Dict>(make_globals(now));
    auto root = std::make_shared<Dict>();
    for (const auto& [name, value] : variables) root->set(name, value);
    Interpreter interpreter(std::move(globals), std::move(root));
    interpreter.index_macros(*body_);
    TString out;
    interpreter.render(*body_, &out);
    return out;
  } catch (const TemplateError& error) {
    return invalid_argument_error(std::string("chat template: ") + error.what());
  }
}

}  // namespace strata::tokenizer::jinja
