"""diffu language server (pygls): infill completions for editors. Built in the lsp issue."""
