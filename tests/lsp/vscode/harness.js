// Activates the compiled VS Code extension (editors/vscode/out/extension.js) outside VS Code, against a
// real `diffu lsp`, with a stand-in for the `vscode` module, and writes what happened as JSON.
//
// VS Code itself cannot run here (no display, no download), so the `vscode` API is played by the objects
// below: enough of it for the extension and vscode-languageclient to start the server, run the LSP
// handshake, register the providers the server asks for, and answer a real inline completion request.
// Usage: node harness.js CONFIG.json REPORT.json, where CONFIG holds the extension path, the diffu
// settings (serverCommand included) and a document to open.
"use strict";
const fs = require("fs");
const Module = require("module");
const path = require("path");

const [configPath, reportPath] = process.argv.slice(2);
const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
const report = {
  activated: false,
  commands: [],
  registered: [],
  statusTexts: [],
  output: [],
  messages: [],
  items: [],
  errors: [],
};
const settings = { ...config.settings };

// -- the stand-in `vscode` module -------------------------------------------------------------------
class Disposable {
  constructor(fn) {
    this.fn = fn;
  }
  static from(...items) {
    return new Disposable(() => items.forEach((d) => d && d.dispose && d.dispose()));
  }
  dispose() {
    if (this.fn) this.fn();
    this.fn = undefined;
  }
}
class EventEmitter {
  constructor() {
    this.listeners = [];
    this.event = (listener, thisArg) => {
      const bound = thisArg ? listener.bind(thisArg) : listener;
      this.listeners.push(bound);
      return new Disposable(() => (this.listeners = this.listeners.filter((l) => l !== bound)));
    };
  }
  fire(value) {
    for (const l of [...this.listeners]) l(value);
  }
  dispose() {
    this.listeners = [];
  }
}
class Position {
  constructor(line, character) {
    this.line = line;
    this.character = character;
  }
}
class Range {
  constructor(a, b, c, d) {
    [this.start, this.end] = typeof a === "number" ? [new Position(a, b), new Position(c, d)] : [a, b];
  }
  get isEmpty() {
    return this.start.line === this.end.line && this.start.character === this.end.character;
  }
  // As VS Code's own Range: JSON writes it as the array [start, end].
  toJSON() {
    return [this.start, this.end];
  }
}
class Selection extends Range {}
class Uri {
  constructor(scheme, p) {
    this.scheme = scheme;
    this.path = p;
    this.fsPath = p;
    this.authority = "";
    this.query = "";
    this.fragment = "";
  }
  static file(p) {
    return new Uri("file", p);
  }
  static parse(s) {
    const m = /^([a-z]+):\/\/(.*)$/.exec(s);
    return m ? new Uri(m[1], decodeURIComponent(m[2])) : new Uri("file", s);
  }
  toString() {
    return `${this.scheme}://${this.path.split("/").map(encodeURIComponent).join("/")}`;
  }
  with() {
    return this;
  }
  toJSON() {
    return this.toString();
  }
}
class CancellationTokenSource {
  constructor() {
    const emitter = new EventEmitter();
    this.token = { isCancellationRequested: false, onCancellationRequested: emitter.event };
    this.emitter = emitter;
  }
  cancel() {
    this.token.isCancellationRequested = true;
    this.emitter.fire();
  }
  dispose() {}
}
// Value classes the converters build: keep their constructor arguments.
const valueClass = (fields) =>
  class {
    constructor(...args) {
      fields.forEach((f, i) => (this[f] = args[i]));
    }
  };
const enumProxy = () => new Proxy({}, { get: (_, k) => (typeof k === "string" ? k : undefined) });

const documentUri = Uri.file(config.document.path);
const document = {
  uri: documentUri,
  fileName: config.document.path,
  languageId: config.document.languageId,
  version: 1,
  isClosed: false,
  isUntitled: false,
  eol: 1,
  getText: () => config.document.text,
  get lineCount() {
    return config.document.text.split("\n").length;
  },
};

const configurationChanged = new EventEmitter();
function getConfiguration(section) {
  // `vscode.workspace.getConfiguration("diffu")` has the section's keys as properties plus methods;
  // `getConfiguration()` (the language client pulling a section) answers get("diffu").
  const values = section === "diffu" ? settings : { diffu: settings };
  const lookup = (key) => key.split(".").reduce((o, k) => (o === undefined ? undefined : o[k]), values);
  return Object.assign(
    {
      get: (key, fallback) => (lookup(key) === undefined ? fallback : lookup(key)),
      has: (key) => lookup(key) !== undefined,
      inspect: () => undefined,
      update: async () => undefined,
    },
    JSON.parse(JSON.stringify(values)),
  );
}

function statusBarItem() {
  const item = { command: undefined, tooltip: "", show() {}, hide() {}, dispose() {} };
  let text = "";
  Object.defineProperty(item, "text", {
    get: () => text,
    set: (value) => {
      text = value;
      report.statusTexts.push(value);
    },
  });
  return item;
}

let inlineProvider;
const languages = new Proxy(
  {
    match(selector, doc) {
      const filters = Array.isArray(selector) ? selector : [selector];
      return filters.some(
        (f) =>
          typeof f === "string"
            ? f === doc.languageId
            : (!f.language || f.language === doc.languageId) && (!f.scheme || f.scheme === doc.uri.scheme),
      )
        ? 10
        : 0;
    },
    registerInlineCompletionItemProvider(selector, provider) {
      report.registered.push({ kind: "inlineCompletion", selector });
      inlineProvider = provider;
      return new Disposable();
    },
    createDiagnosticCollection: () => ({ set() {}, delete() {}, clear() {}, dispose() {}, forEach() {} }),
  },
  {
    get(target, key) {
      if (key in target) return target[key];
      return (...args) => {
        if (typeof key === "string" && key.startsWith("register")) report.registered.push({ kind: key });
        return new Disposable();
      };
    },
  },
);

const registeredCommands = new Map();
const vscode = {
  version: "1.82.0",
  Disposable,
  EventEmitter,
  Position,
  Range,
  Selection,
  Uri,
  CancellationTokenSource,
  CancellationError: class CancellationError extends Error {},
  InlineCompletionItem: valueClass(["insertText", "range", "command"]),
  InlineCompletionList: valueClass(["items"]),
  CompletionItem: valueClass(["label", "kind"]),
  CallHierarchyItem: valueClass(["kind", "name", "detail", "uri", "range", "selectionRange"]),
  TypeHierarchyItem: valueClass(["kind", "name", "detail", "uri", "range", "selectionRange"]),
  CodeLens: valueClass(["range", "command"]),
  DocumentLink: valueClass(["range", "target"]),
  InlayHint: valueClass(["position", "label", "kind"]),
  SymbolInformation: valueClass(["name", "kind", "containerName", "location"]),
  CodeAction: valueClass(["title", "kind"]),
  Diagnostic: valueClass(["range", "message", "severity"]),
  CompletionList: valueClass(["items", "isIncomplete"]),
  TextEdit: valueClass(["range", "newText"]),
  SnippetString: valueClass(["value"]),
  MarkdownString: valueClass(["value"]),
  Location: valueClass(["uri", "range"]),
  WorkspaceEdit: class {
    set() {}
    entries() {
      return [];
    }
  },
  RelativePattern: valueClass(["base", "pattern"]),
  ProgressLocation: { SourceControl: 1, Window: 10, Notification: 15 },
  StatusBarAlignment: { Left: 1, Right: 2 },
  InlineCompletionTriggerKind: { Invoke: 0, Automatic: 1 },
  ...Object.fromEntries(
    [
      "CompletionItemKind",
      "CompletionItemTag",
      "CompletionTriggerKind",
      "DiagnosticSeverity",
      "DiagnosticTag",
      "SymbolKind",
      "SymbolTag",
      "CodeActionKind",
      "CodeActionTriggerKind",
      "SignatureHelpTriggerKind",
      "DocumentHighlightKind",
      "FoldingRangeKind",
      "TextDocumentSaveReason",
      "FileType",
    ].map((name) => [name, enumProxy()]),
  ),
  TabInputText: class {},
  TabInputTextDiff: class {},
  TabInputCustom: class {},
  env: { language: "en", appName: "harness", openExternal: async () => true },
  extensions: { getExtension: () => undefined, all: [] },
  commands: {
    registerCommand(name, fn) {
      report.commands.push(name);
      registeredCommands.set(name, fn);
      return new Disposable(() => registeredCommands.delete(name));
    },
    executeCommand: async (name, ...args) => registeredCommands.get(name)?.(...args),
  },
  languages,
  workspace: {
    getConfiguration,
    onDidChangeConfiguration: configurationChanged.event,
    textDocuments: [document],
    workspaceFolders: [{ uri: Uri.file(path.dirname(config.document.path)), name: "ws", index: 0 }],
    onDidOpenTextDocument: new EventEmitter().event,
    onDidCloseTextDocument: new EventEmitter().event,
    onDidChangeTextDocument: new EventEmitter().event,
    onDidSaveTextDocument: new EventEmitter().event,
    onWillSaveTextDocument: new EventEmitter().event,
    onDidChangeWorkspaceFolders: new EventEmitter().event,
    createFileSystemWatcher: () => ({ onDidCreate: () => {}, onDidChange: () => {}, onDidDelete: () => {}, dispose() {} }),
    applyEdit: async () => true,
  },
  window: {
    activeTextEditor: undefined,
    visibleTextEditors: [],
    onDidChangeActiveTextEditor: new EventEmitter().event,
    onDidChangeVisibleTextEditors: new EventEmitter().event,
    tabGroups: { all: [], onDidChangeTabs: new EventEmitter().event, onDidChangeTabGroups: new EventEmitter().event },
    createOutputChannel: (name) => ({
      name,
      append: (text) => report.output.push(String(text)),
      appendLine: (text) => report.output.push(String(text)),
      replace() {},
      clear() {},
      show() {},
      hide() {},
      dispose() {},
    }),
    createStatusBarItem: statusBarItem,
    showInformationMessage: async (message) => void report.messages.push({ level: "info", message }),
    showWarningMessage: async (message) => void report.messages.push({ level: "warning", message }),
    showErrorMessage: async (message) => void report.messages.push({ level: "error", message }),
    withProgress: async (_options, task) => task({ report() {} }, new CancellationTokenSource().token),
    showTextDocument: async () => undefined,
  },
};

const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) {
  return request === "vscode" ? "vscode" : resolve.call(this, request, ...rest);
};
require.cache.vscode = { id: "vscode", filename: "vscode", loaded: true, exports: vscode };

// -- the run ----------------------------------------------------------------------------------------
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(predicate, what, ms = 30000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (predicate()) return;
    await sleep(20);
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function status() {
  const before = report.output.length;
  await vscode.commands.executeCommand("diffu.showStatus");
  const text = report.output.slice(before).join("\n");
  return JSON.parse(text.slice(text.indexOf("{")));
}

// One request through the provider the server registered, as VS Code makes it; the items as plain data.
async function ask(position, triggerKind, selectedCompletionInfo) {
  const context = { triggerKind, selectedCompletionInfo };
  const result = await inlineProvider.provideInlineCompletionItems(
    document,
    position,
    context,
    new CancellationTokenSource().token,
  );
  return (Array.isArray(result) ? result : result?.items ?? []).map((i) => ({
    insertText: typeof i.insertText === "string" ? i.insertText : i.insertText?.value,
    range: i.range && [i.range.start.line, i.range.start.character, i.range.end.line, i.range.end.character],
  }));
}

async function main() {
  const extension = require(config.extension);
  const context = { subscriptions: [], extensionPath: path.dirname(config.extension) };
  await extension.activate(context);
  report.activated = true;
  await until(() => inlineProvider, "the inline completion provider (registered by the server)");
  await until(() => report.statusTexts.some((t) => t.includes("diffu") && !t.includes("loading~spin")), "a state");
  // An explicit request at the end of the document's line, as Alt+\ makes it.
  const [line, character] = config.document.cursor;
  const cursor = new Position(line, character);
  report.items = await ask(cursor, 0);
  // And an automatic one (as while typing), at the end of the first line.
  const firstLineEnd = new Position(0, config.document.text.split("\n")[0].length);
  report.automaticItems = (await ask(firstLineEnd, 1)).length;
  // With the suggest widget open on an item: VS Code passes it as selectedCompletionInfo, its range a
  // vscode.Range (an array in JSON unless the extension converts it).
  const widget = { range: new Range(line, character, line, character), text: config.document.selected };
  report.selectedItems = await ask(cursor, 0, widget);
  await until(() => report.statusTexts.some((t) => / ms$/.test(t)), "the latency in the status bar");
  // Snooze, then toggle back: the status bar follows, and typing gets nothing while snoozed.
  await vscode.commands.executeCommand("diffu.snoozeSuggestions");
  report.snoozedStatus = report.statusTexts[report.statusTexts.length - 1];
  report.snoozedItems = (await ask(firstLineEnd, 1)).length;
  await vscode.commands.executeCommand("diffu.toggleSuggestions");
  report.resumedStatus = report.statusTexts[report.statusTexts.length - 1];
  // A settings change in VS Code reaches the server (the client pushes the whole section, its own keys too).
  settings.debounceMs = 77;
  configurationChanged.fire({ affectsConfiguration: (s) => s === "diffu" || s.startsWith("diffu.debounce") });
  for (let i = 0; i < 100 && (await status()).settings.debounceMs !== 77; i++) await sleep(50);
  report.status = await status();
  await extension.deactivate();
  report.deactivated = true;
}

main()
  .catch((err) => report.errors.push(String(err && err.stack ? err.stack : err)))
  .finally(() => {
    fs.writeFileSync(reportPath, JSON.stringify(report, null, 2));
    process.exit(0);
  });
