//! How the process logs: the binary's alone to set up (the libraries install no subscriber).

use tender_config::LogFormat;

/// `tender serve`'s logging (also `catalog sync` on a data directory, with `TENDER_LOG` set):
/// `TENDER_LOG` (default `info`) in `format`, through the log sink, with the libraries' noise
/// limited.
pub fn serve(format: LogFormat) {
    use tender_server::access::LogStyle;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENDER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(crate::logsink::sink());
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let (installed, style) = match format {
        LogFormat::Json => {
            (builder.json().flatten_event(true).finish().with(crate::noise::library_noise()).try_init(), LogStyle::Json)
        }
        LogFormat::Text => (builder.finish().with(crate::noise::library_noise()).try_init(), LogStyle::Text),
    };
    // Access lines are written as this subscriber would format them, without its machinery
    // (tender_server::access::log_directly); its `access` filter still applies. Without ANSI
    // colours only: the direct lines have none.
    if installed.is_ok() && !ansi {
        tender_server::access::log_directly(style, crate::logsink::write_access_line);
    }
}

/// The commands that run the fetch layer in-process (`prefetch` and `export` with `--data`):
/// warnings and errors on stderr, or what `TENDER_LOG` asks for.
pub fn warnings() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENDER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
