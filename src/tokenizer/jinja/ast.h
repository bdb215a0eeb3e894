// Syntax tree of a parsed Jinja template (parser.cpp builds it, interpreter.cpp walks it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "value.h"

namespace strata::tokenizer::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // [children...]
    kTuple,    // (children...)
    kDict,     // {children[2i]: children[2i+1]}
    kAttr,     // children[0].name
    kItem,     // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]] (null = omitted)
    kCall,     // children[0](children[1..], with keyword names for the last ones)
    kFilter,   // children[0] | name(children[1..])
    kTest,     // children[0] is [not] name(children[1..])
    kUnary,    // op children[0]: "not", "-", "+"
    kBinary,   // children[0] op children[1]: and or + - * / // % ** ~ == != < <= > >= in notin
    kCond,     // children[1] if children[0] else children[2] (null: undefined)
  };

  Kind kind;
  std::string name;                   // name, attribute, filter, test or operator
  Value value;                        // kLiteral
  bool negated = false;               // kTest: "is not"
  std::vector<ExprPtr> children;      // null entries for omitted slice parts / else
  std::vector<std::string> keywords;  // kCall/kFilter/kTest: names of the trailing keyword args
  int line = 0;

  Expr(Kind k, int l) : kind(k), line(l) {}
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

// An assignment target: a name, a namespace attribute (`ns.x`), or a tuple of names.
struct Target {
  std::vector<std::string> names;  // one name, or several for tuple unpacking
  std::string attribute;           // set: `names[0].attribute = ...`
  bool is_tuple = false;
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (cond, body)...; else_body
    kFor,          // for target in expr [if filter] ... else_body
    kSet,          // set target = expr
    kSetBlock,     // set target [| filters] %} body {% endset
    kMacro,        // macro name(params with defaults) body
    kCallBlock,    // call expr(...) body  (body rendered by the macro's caller())
    kFilterBlock,  // filter name(args) body
    kBreak,
    kContinue,
  };

  Kind kind;
  int line = 0;
  std::string text;  // kText; kMacro: name; kFilterBlock: filter name
  ExprPtr expr;      // kOutput, kFor (iterable), kSet (value), kCallBlock (call)
  // kFor: the `if` clause; kSetBlock, kFilterBlock: the filter chain applied to the body (its
  // innermost input is null and stands for the body)
  ExprPtr filter;
  Target target;   // kFor, kSet, kSetBlock
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  Body body;               // kFor, kSetBlock, kMacro, kCallBlock, kFilterBlock
  Body else_body;          // kIf, kFor
  bool recursive = false;  // kFor ... recursive
  // kMacro: parameter names and defaults (null = required); kCallBlock: caller parameters.
  std::vector<std::pair<std::string, ExprPtr>> params;

  Stmt(Kind k, int l) : kind(k), line(l) {}
};

// Parses `source` with transformers' settings (trim_blocks, lstrip_blocks, loop controls, the
// `generation` block of its AssistantTracker). TemplateError with the line on a syntax error.
Body parse_template(std::string_view source);

}  // namespace strata::tokenizer::jinja
