// diffu for VS Code: starts `diffu lsp` and lets vscode-languageclient do the rest.
//
// Inline completion (ghost text) is a proposed LSP 3.18 feature in vscode-languageclient 9, so the client
// must opt in with registerProposedFeatures(); without it the client would not declare
// textDocument.inlineCompletion and the server would fall back to the completion list.
import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  TransportKind,
} from "vscode-languageclient/node";

const SECTION = "diffu";
// Extension-side settings that are not the server's (the server warns about keys it does not know).
const CLIENT_ONLY = new Set(["serverCommand"]);

let client: LanguageClient | undefined;
let output: vscode.OutputChannel | undefined;

/** The server's settings: the `diffu` section without the extension's own keys, empty strings unset. */
function serverSettings(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration(SECTION);
  const settings: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(config)) {
    if (typeof value === "function" || CLIENT_ONLY.has(key) || value === "") {
      continue;
    }
    settings[key] = value;
  }
  return settings;
}

function createClient(): LanguageClient {
  const command = vscode.workspace.getConfiguration(SECTION).get<string[]>("serverCommand", ["diffu", "lsp"]);
  if (!Array.isArray(command) || command.length === 0) {
    throw new Error("diffu.serverCommand must be a non-empty array, e.g. [\"diffu\", \"lsp\"]");
  }
  // TransportKind.stdio adds `--stdio` to the arguments; `diffu lsp` accepts it.
  const serverOptions: ServerOptions = { command: command[0], args: command.slice(1), transport: TransportKind.stdio };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: serverSettings(),
    // Pushes workspace/didChangeConfiguration with the `diffu` section whenever it changes.
    synchronize: { configurationSection: SECTION },
    outputChannel: output,
  };
  const languageClient = new LanguageClient("diffu", "diffu", serverOptions, clientOptions);
  languageClient.registerProposedFeatures();
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
  await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Window, title: "diffu: filling holes" },
    () =>
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

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("diffu");
  context.subscriptions.push(output);
  client = createClient();
  context.subscriptions.push(
    vscode.commands.registerCommand("diffu.fillHolesInEditor", fillHoles),
    vscode.commands.registerCommand("diffu.showStatus", showStatus),
    vscode.commands.registerCommand("diffu.restart", async () => {
      await client?.stop();
      client = createClient();
      await client.start();
    }),
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
