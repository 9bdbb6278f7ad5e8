-- small.lua - wrk script of bench/small.sh (issue 23): GETs rotating over the paths in the file
-- WRK_PATHS (one a line; each wrk thread starts at another offset), with an Authorization header
-- when WRK_AUTH is set. done() prints one line the bench parses:
--   WRKRESULT requests=.. duration_us=.. bytes=.. connect=.. read=.. write=.. status=.. timeout=..
--             p50_us=.. p90_us=.. p99_us=.. max_us=..
-- (wrk counts a status >= 400 in errors.status; wrk cannot do HEAD, its parser waits for a body.)
local paths = {}
local i = 0

function init(args)
  for line in io.lines(os.getenv("WRK_PATHS")) do
    if #line > 0 then paths[#paths + 1] = line end
  end
  i = math.random(#paths) - 1
  local auth = os.getenv("WRK_AUTH")
  if auth and #auth > 0 then wrk.headers["Authorization"] = auth end
  wrk.headers["Accept"] = "application/vnd.oci.image.manifest.v1+json, */*"
end

function request()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end

function done(s, lat, req)
  io.write(string.format(
    "WRKRESULT requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d " ..
    "p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    s.requests, s.duration, s.bytes, s.errors.connect, s.errors.read, s.errors.write, s.errors.status,
    s.errors.timeout, lat:percentile(50), lat:percentile(90), lat:percentile(99), lat.max))
end
