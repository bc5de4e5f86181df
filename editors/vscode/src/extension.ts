// diffu for VS Code: starts `diffu lsp`, lets vscode-languageclient do the LSP work, and shows the
// server's state in the status bar.
//
// Inline completion (ghost text) is a proposed LSP 3.18 feature in vscode-languageclient 9, so the client
// must opt in with registerProposedFeatures(); without it the client would not declare
// textDocument.inlineCompletion and the server would fall back to the completion list.
import * as vscode from "vscode";
import {
  ConfigurationParams,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  TransportKind,
} from "vscode-languageclient/node";

const SECTION = "diffu";
// Settings of this extension, not of the server: it would have nothing to do with them.
const CLIENT_ONLY = new Set(["serverCommand", "trace"]);
const STATUS_NOTIFICATION = "diffu/status";

/** The server's status item, as the `diffu/status` notification carries it. */
export interface ServerStatus {
  state: "disabled" | "paused" | "connecting" | "ready" | "busy" | "unavailable";
  message: string;
  latencyMs: number | null;
  model: string;
}

let client: LanguageClient | undefined;
let output: vscode.OutputChannel | undefined;
let statusItem: vscode.StatusBarItem | undefined;

/** A `diffu` settings object without the extension's own keys; empty strings mean unset. */
export function serverSettings(section: Record<string, unknown>): Record<string, unknown> {
  const settings: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(section)) {
    if (typeof value === "function" || CLIENT_ONLY.has(key) || value === "") {
      continue;
    }
    settings[key] = value;
  }
  return settings;
}

function currentSettings(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration(SECTION);
  return serverSettings(JSON.parse(JSON.stringify(config)) as Record<string, unknown>);
}

/** The status bar's text and tooltip for the server's state (undefined: no word from it yet). */
export function statusText(status: ServerStatus | undefined): { text: string; tooltip: string } {
  if (!status) {
    return { text: "$(loading~spin) diffu", tooltip: "diffu: starting the language server" };
  }
  const tooltip = `diffu: ${status.message}`;
  switch (status.state) {
    case "ready":
      return { text: status.latencyMs === null ? "$(sparkle) diffu" : `$(sparkle) diffu ${status.latencyMs} ms`, tooltip };
    case "busy":
      return { text: "$(loading~spin) diffu", tooltip };
    case "connecting":
      return { text: "$(sync~spin) diffu", tooltip };
    case "disabled":
      return { text: "$(circle-slash) diffu", tooltip };
    case "paused":
      return { text: "$(debug-pause) diffu", tooltip };
    default:
      return { text: "$(warning) diffu", tooltip };
  }
}

function showStatusItem(status: ServerStatus | undefined): void {
  if (!statusItem) {
    return;
  }
  const { text, tooltip } = statusText(status);
  statusItem.text = text;
  statusItem.tooltip = tooltip;
  statusItem.show();
}

/**
 * VS Code's inline completion context as LSP 3.18 has it. vscode-languageclient 9.0.1 passes the context
 * on as VS Code holds it: the trigger kind numbered as the 3.17 proposal did (Invoke 0, Automatic 1, where
 * LSP 3.18 has Invoked 1, Automatic 2: an explicit request would be refused as invalid and every
 * automatic one taken for an explicit one), and `selectedCompletionInfo.range` as a `vscode.Range`, which
 * JSON writes as an array `[start, end]` (fixed in the client after 9.0.1): the server refused that with
 * -32602, so nothing was suggested while the suggest widget was open.
 */
export function protocolContext(context: vscode.InlineCompletionContext): vscode.InlineCompletionContext {
  const selected = context.selectedCompletionInfo;
  const position = (p: vscode.Position) => ({ line: p.line, character: p.character });
  return {
    ...context,
    triggerKind: context.triggerKind + 1,
    selectedCompletionInfo: selected && {
      text: selected.text,
      // The client sends this object as it is: give it the protocol's shape of a range.
      range: { start: position(selected.range.start), end: position(selected.range.end) } as vscode.Range,
    },
  };
}

function createClient(): LanguageClient {
  const command = vscode.workspace.getConfiguration(SECTION).get<string[]>("serverCommand", ["diffu", "lsp"]);
  if (!Array.isArray(command) || command.length === 0) {
    throw new Error('diffu.serverCommand must be a non-empty array, e.g. ["diffu", "lsp"]');
  }
  // TransportKind.stdio adds `--stdio` to the arguments; `diffu lsp` accepts it.
  const serverOptions: ServerOptions = { command: command[0], args: command.slice(1), transport: TransportKind.stdio };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: currentSettings(),
    outputChannel: output,
    middleware: {
      provideInlineCompletionItems: (document, position, context, token, next) =>
        next(document, position, protocolContext(context), token),
      workspace: {
        // The server pulls its section (workspace/configuration): answer it without our own keys.
        configuration: async (params: ConfigurationParams, token, next) => {
          const result = await next(params, token);
          if (!Array.isArray(result)) {
            return result;
          }
          return result.map((value, i) =>
            params.items[i]?.section === SECTION && value && typeof value === "object"
              ? serverSettings(value as Record<string, unknown>)
              : value,
          );
        },
      },
    },
  };
  const languageClient = new LanguageClient("diffu", "diffu", serverOptions, clientOptions);
  languageClient.registerProposedFeatures();
  languageClient.onNotification(STATUS_NOTIFICATION, (status: ServerStatus) => showStatusItem(status));
  return languageClient;
}

async function fillHoles(): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (!client || !editor) {
    void vscode.window.showWarningMessage("diffu: open a file first (and check that the server is running).");
    return;
  }
  const selection = editor.selection;
  const range = selection.isEmpty ? null : client.code2ProtocolConverter.asRange(selection);
  // The server fills every hole in one diffusion run and applies the fills with workspace/applyEdit.
  await vscode.window.withProgress({ location: vscode.ProgressLocation.Window, title: "diffu: filling holes" }, () =>
    client!.sendRequest(ExecuteCommandRequest.type, {
      command: "diffu.fillHoles",
      arguments: [editor.document.uri.toString(), range],
    }),
  );
}

async function showStatus(): Promise<void> {
  if (!client) {
    return;
  }
  const status = await client.sendRequest(ExecuteCommandRequest.type, { command: "diffu.status", arguments: [] });
  output?.appendLine(JSON.stringify(status, null, 2));
  output?.show(true);
}

/** Run a server command that answers with the status item (toggle, snooze), and show that item. */
async function statusCommand(command: string, args: unknown[]): Promise<void> {
  if (!client) {
    void vscode.window.showWarningMessage("diffu: the language server is not running.");
    return;
  }
  const status = (await client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args })) as ServerStatus;
  showStatusItem(status);
}

/** Pause suggestions while typing until toggled again, or resume them (an explicit request still asks). */
function toggleSuggestions(): Promise<void> {
  return statusCommand("diffu.toggle", []);
}

/** Pause suggestions while typing for `minutes` (from a keybinding's args), else `diffu.snoozeMinutes`. */
function snoozeSuggestions(minutes?: unknown): Promise<void> {
  return statusCommand("diffu.snooze", typeof minutes === "number" ? [minutes] : []);
}

async function restart(): Promise<void> {
  await client?.stop();
  showStatusItem(undefined);
  client = createClient();
  await client.start();
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("diffu");
  statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  statusItem.command = "diffu.showStatus";
  showStatusItem(undefined);
  context.subscriptions.push(output, statusItem);
  client = createClient();
  context.subscriptions.push(
    vscode.commands.registerCommand("diffu.fillHolesInEditor", fillHoles),
    vscode.commands.registerCommand("diffu.showStatus", showStatus),
    vscode.commands.registerCommand("diffu.restart", restart),
    vscode.commands.registerCommand("diffu.toggleSuggestions", toggleSuggestions),
    vscode.commands.registerCommand("diffu.snoozeSuggestions", snoozeSuggestions),
    // The server registers for changes of its section (the client then tells it, and it ignores the keys
    // that are ours); only a new server command needs a new server.
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (event.affectsConfiguration(`${SECTION}.serverCommand`)) {
        await vscode.commands.executeCommand("diffu.restart");
      }
    }),
  );
  await client.start();
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}
